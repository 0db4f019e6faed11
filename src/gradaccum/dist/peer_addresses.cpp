#include "gradaccum/dist/peer_addresses.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <torch/torch.h>

#include <mutex>
#include <regex>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "gradaccum/dist/process_group.h"

namespace gradaccum::dist {

namespace {

// Enough for a host's interfaces; more are left out of the table (their errors go unnamed).
constexpr int64_t kMostAddresses = 16;

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}
PeerAddresses& table() {
  static PeerAddresses t;
  return t;
}

}  // namespace

std::vector<uint32_t> host_ipv4_addresses() {
  std::vector<uint32_t> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    out.push_back(ntohl(reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr));
  }
  freeifaddrs(list);
  return out;
}

PeerAddresses PeerAddresses::exchange(c10d::Backend& group) {
  const int world = group.getSize();
  const auto options = collective_options(group).dtype(torch::kLong);
  auto mine = torch::full({kMostAddresses}, -1, torch::kLong);
  const auto addresses = host_ipv4_addresses();
  for (size_t i = 0; i < addresses.size() && static_cast<int64_t>(i) < kMostAddresses; ++i) {
    mine[static_cast<int64_t>(i)] = static_cast<int64_t>(addresses[i]);
  }
  std::vector<torch::Tensor> input{mine.to(options.device())};
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int r = 0; r < world; ++r) output[0].push_back(torch::empty({kMostAddresses}, options));
  wait_for(group.allgather(output, input), group.getRank(), "the exchange of the ranks' addresses");
  PeerAddresses table;
  for (int r = 0; r < world; ++r) {
    const auto theirs = output[0][r].cpu();
    for (int64_t i = 0; i < kMostAddresses; ++i) {
      const int64_t a = theirs[i].item<int64_t>();
      if (a >= 0) table.add(r, static_cast<uint32_t>(a));
    }
  }
  return table;
}

std::vector<int> PeerAddresses::ranks_at(const std::string& dotted, int self) const {
  in_addr parsed{};
  if (inet_pton(AF_INET, dotted.c_str(), &parsed) != 1) return {};
  const auto found = ranks_.find(ntohl(parsed.s_addr));
  std::vector<int> out;
  if (found == ranks_.end()) return out;
  for (const int r : found->second) {
    if (r != self) out.push_back(r);
  }
  return out;
}

std::string PeerAddresses::annotate(const std::string& cause, int self) const {
  static const std::regex peer(R"(\[([0-9]{1,3}(\.[0-9]{1,3}){3})\]:[0-9]+)");
  std::smatch m;
  if (!std::regex_search(cause, m, peer)) return cause;
  const auto ranks = ranks_at(m[1].str(), self);
  if (ranks.empty()) return cause;
  const std::string note =
      ranks.size() == 1 ? fmt::format(" (rank {})", ranks[0]) : fmt::format(" (ranks {})", fmt::join(ranks, ", "));
  const auto end = static_cast<size_t>(m.position(0) + m.length(0));
  return cause.substr(0, end) + note + cause.substr(end);
}

void remember_peer_addresses(const PeerAddresses& addresses) {
  std::lock_guard<std::mutex> lock(table_mutex());
  table() = addresses;
}

PeerAddresses peer_addresses() {
  std::lock_guard<std::mutex> lock(table_mutex());
  return table();
}

}  // namespace gradaccum::dist
