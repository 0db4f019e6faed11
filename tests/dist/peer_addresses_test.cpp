// A lost peer named by its rank as well as by its address (dist/peer_addresses.h): the table of
// the ranks' addresses, gathered over a real Gloo group, and the note it adds to a transport
// error. On several hosts: tests/dist/multi_host_test.cpp (the elastic tests' lost host).
#include "gradaccum/dist/peer_addresses.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "in_process_ranks.h"

namespace peer_addresses_test {

using gradaccum::dist::PeerAddresses;

uint32_t address(const char* dotted) {
  in_addr a{};
  EXPECT_EQ(inet_pton(AF_INET, dotted, &a), 1) << dotted;
  return ntohl(a.s_addr);
}

TEST(PeerAddresses, AnAddressInAnErrorGainsTheRanksAtIt) {
  PeerAddresses table;
  table.add(0, address("10.231.0.1"));
  table.add(1, address("10.231.0.2"));
  table.add(2, address("10.231.0.3"));
  table.add(3, address("10.231.0.3"));  // two ranks on one host
  const std::string lost = "Connection closed by peer [10.231.0.2]:25823.";
  EXPECT_EQ(table.annotate(lost, 0), "Connection closed by peer [10.231.0.2]:25823 (rank 1).");
  EXPECT_EQ(table.annotate("Read error [10.231.0.3]:4001: Connection reset by peer", 0),
            "Read error [10.231.0.3]:4001 (ranks 2, 3): Connection reset by peer");
  // Its own host's other rank only; an address of nobody else's, or none, leaves the text alone.
  EXPECT_EQ(table.annotate("peer [10.231.0.3]:4001 gone", 2), "peer [10.231.0.3]:4001 (rank 3) gone");
  EXPECT_EQ(table.annotate(lost, 1), lost);
  EXPECT_EQ(table.annotate("peer [10.9.9.9]:1 gone", 0), "peer [10.9.9.9]:1 gone");
  EXPECT_EQ(table.annotate("Timed out waiting 8000ms for recv operation to complete", 0),
            "Timed out waiting 8000ms for recv operation to complete");
  EXPECT_EQ(table.ranks_at("10.231.0.3", 0), (std::vector<int>{2, 3}));
  EXPECT_TRUE(table.ranks_at("not an address", 0).empty());
}

// Three ranks of one host over Gloo: each learns every rank's addresses, this host's own among
// them (loopback included), so each names the other two at 127.0.0.1.
TEST(PeerAddresses, TheExchangeGivesEveryRankEveryRanksAddresses) {
  const auto mine = gradaccum::dist::host_ipv4_addresses();
  ASSERT_NE(std::find(mine.begin(), mine.end(), address("127.0.0.1")), mine.end());
  std::mutex mutex;
  std::vector<std::vector<int>> others(3);
  gradaccum::testing::run_on_ranks(3, [&](const c10::intrusive_ptr<c10d::Backend>& group, int rank) {
    const auto table = PeerAddresses::exchange(*group);
    std::lock_guard<std::mutex> lock(mutex);
    others[rank] = table.ranks_at("127.0.0.1", rank);
  });
  EXPECT_EQ(others[0], (std::vector<int>{1, 2}));
  EXPECT_EQ(others[1], (std::vector<int>{0, 2}));
  EXPECT_EQ(others[2], (std::vector<int>{0, 1}));
}

}  // namespace peer_addresses_test
