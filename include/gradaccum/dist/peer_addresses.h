// Which rank a peer address in a transport error belongs to. Gloo names a lost peer by its
// address only ("Connection closed by peer [10.0.0.2]:25823"); the ranks' IPv4 addresses are
// exchanged once, when the process group is made, so that the one-line error of a failed
// collective names the rank as well: "... [10.0.0.2]:25823 (rank 1)".
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace c10d {
class Backend;
}

namespace gradaccum::dist {

// This host's IPv4 addresses (every interface's, loopback included), in host byte order.
std::vector<uint32_t> host_ipv4_addresses();

class PeerAddresses {
 public:
  // Every rank's addresses, gathered over `group`: a collective, every rank calls it.
  static PeerAddresses exchange(c10d::Backend& group);
  void add(int rank, uint32_t address) { ranks_[address].insert(rank); }

  // The ranks other than `self` at `dotted` (an IPv4 address as "10.0.0.2"), ascending.
  std::vector<int> ranks_at(const std::string& dotted, int self) const;
  // `cause` with " (rank R)" or " (ranks R, S)" after its first "[A.B.C.D]:PORT" when that address
  // is another rank's; unchanged otherwise.
  std::string annotate(const std::string& cause, int self) const;

 private:
  std::map<uint32_t, std::set<int>> ranks_;
};

// The table of this process's process group (connect() sets it; ranks that run as threads of one
// process share one host, hence one table), and a copy of it.
void remember_peer_addresses(const PeerAddresses& addresses);
PeerAddresses peer_addresses();

}  // namespace gradaccum::dist
