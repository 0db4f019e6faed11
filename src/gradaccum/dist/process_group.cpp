#include "gradaccum/dist/process_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>

#include "gradaccum/core/check.h"

namespace gradaccum::dist {

c10::intrusive_ptr<c10d::ProcessGroup> connect(const DistEnvironment& env,
                                               std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env.master_port);
  options.isServer = env.rank == 0;
  options.numWorkers = static_cast<size_t>(env.world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw Error(fmt::format("rank {}: cannot rendezvous at MASTER_ADDR={} MASTER_PORT={} within {} s: {}",
                            env.rank, env.master_addr, env.master_port, timeout.count() / 1000,
                            what.substr(0, what.find('\n'))));
  }
  auto gloo = c10d::ProcessGroupGloo::Options::create(timeout);
  // GLOO_SOCKET_IFNAME picks the interface on multi-homed hosts, as in PyTorch.
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME")) {
    gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  } else if (env.master_addr == "127.0.0.1" || env.master_addr == "localhost") {
    gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    gloo->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  gloo->threads = 2;
  try {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(env.rank),
                                                       static_cast<int>(env.world_size), gloo);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw Error(fmt::format("rank {}: cannot connect the Gloo process group: {}", env.rank,
                            what.substr(0, what.find('\n'))));
  }
}

void check_same_on_all_ranks(c10d::ProcessGroup& group, int64_t value, const std::string& what) {
  const int world = group.getSize();
  std::vector<torch::Tensor> input{torch::full({1}, value, torch::kLong)};
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int r = 0; r < world; ++r) output[0].push_back(torch::empty({1}, torch::kLong));
  group.allgather(output, input)->wait();
  for (int r = 1; r < world; ++r) {
    GA_CHECK(output[0][r].item<int64_t>() == output[0][0].item<int64_t>(),
             "rank {}'s {} differs from rank 0's", r, what);
  }
}

void barrier(c10d::ProcessGroup& group, const std::string& what) {
  // An all-reduce of one element: Gloo's barrier() would do, but this works
  // unchanged on NCCL, whose barrier needs a device guess.
  std::vector<torch::Tensor> flag{torch::zeros({1})};
  try {
    group.allreduce(flag)->wait();
  } catch (const std::exception& e) {
    const std::string message = e.what();
    throw Error(fmt::format("rank {}: {} failed, a peer rank died or stalled past dist_timeout: {}",
                            group.getRank(), what, message.substr(0, message.find('\n'))));
  }
}

}  // namespace gradaccum::dist
