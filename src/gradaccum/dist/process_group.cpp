#include "gradaccum/dist/process_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef GRADACCUM_WITH_CUDA
// The NCCL path is compiled only with -DGRADACCUM_WITH_CUDA=ON (or GRADACCUM_WITH_NCCL). CI compiles
// and links it; it has not run on a GPU yet (tests/gpu/gpu_test.cpp runs it where one is visible).
#ifndef USE_C10D_NCCL
#error "GRADACCUM_WITH_NCCL needs a libtorch built with NCCL (its targets do not define USE_C10D_NCCL)"
#endif
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>

#include "gradaccum/base/check.h"

namespace gradaccum::dist {

namespace {

// Where the small collectives below put their tensors: NCCL only reduces CUDA
// tensors (on the current device, which connect() set), Gloo takes CPU ones.
torch::TensorOptions collective_options(const c10d::Backend& group) {
  return torch::TensorOptions().device(group.getBackendName() == "nccl" ? torch::kCUDA : torch::kCPU);
}

c10::intrusive_ptr<c10d::Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const DistEnvironment& env,
                                            std::chrono::milliseconds timeout) {
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
    throw Error(
        fmt::format("rank {}: cannot connect the Gloo process group: {}", env.rank, what.substr(0, what.find('\n'))));
  }
}

#ifdef GRADACCUM_WITH_CUDA
c10::intrusive_ptr<c10d::Backend> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const DistEnvironment& env,
                                            std::chrono::milliseconds timeout, c10::Device device) {
  // One GPU per rank: "cuda" without an index means the LOCAL_RANK-th GPU of
  // this host, as with torchrun. Setting it first also makes the model's later
  // .to("cuda") land there.
  const auto index = device.has_index() ? device.index() : static_cast<c10::DeviceIndex>(env.local_rank);
  GA_CHECK(index < c10::cuda::device_count(), "rank {}: device cuda:{} does not exist ({} CUDA devices)", env.rank,
           static_cast<int>(index), static_cast<int>(c10::cuda::device_count()));
  c10::cuda::set_device(index);
  auto nccl = c10d::ProcessGroupNCCL::Options::create();
  // As with Gloo, collectives fail after `timeout` (NCCL enforces it with
  // NCCL_BLOCKING_WAIT=1 or NCCL_ASYNC_ERROR_HANDLING=1).
  nccl->timeout = timeout;
  try {
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, static_cast<int>(env.rank),
                                                       static_cast<int>(env.world_size), nccl);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw Error(
        fmt::format("rank {}: cannot connect the NCCL process group: {}", env.rank, what.substr(0, what.find('\n'))));
  }
}
#endif

}  // namespace

Connection connect(const DistEnvironment& env, std::chrono::milliseconds timeout, c10::Device device) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env.master_port);
  options.isServer = env.rank == 0 && !env.agent_store;
  options.numWorkers = static_cast<size_t>(env.world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw Error(fmt::format("rank {}: cannot rendezvous at MASTER_ADDR={} MASTER_PORT={} within {} s: {}", env.rank,
                            env.master_addr, env.master_port, timeout.count() / 1000, what.substr(0, what.find('\n'))));
  }
#ifdef GRADACCUM_WITH_CUDA
  if (device.is_cuda()) return {make_nccl(store, env, timeout, device), store};
#endif
  return {make_gloo(store, env, timeout), store};
}

void check_same_on_all_ranks(c10d::Backend& group, int64_t value, const std::string& what) {
  const int world = group.getSize();
  const auto options = collective_options(group).dtype(torch::kLong);
  std::vector<torch::Tensor> input{torch::full({1}, value, options)};
  std::vector<std::vector<torch::Tensor>> output(1);
  for (int r = 0; r < world; ++r) output[0].push_back(torch::empty({1}, options));
  group.allgather(output, input)->wait();
  for (int r = 1; r < world; ++r) {
    GA_CHECK(output[0][r].item<int64_t>() == output[0][0].item<int64_t>(), "rank {}'s {} differs from rank 0's", r,
             what);
  }
}

void wait_for(const c10::intrusive_ptr<c10d::Work>& work, int64_t rank, const std::string& what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    const std::string message = e.what();
    throw Error(fmt::format("rank {}: {} failed, a peer rank died or stalled past dist_timeout: {}", rank, what,
                            message.substr(0, message.find('\n'))));
  }
}

void barrier(c10d::Backend& group, const std::string& what) {
  // An all-reduce of one element: Gloo's barrier() would do, but this works
  // unchanged on NCCL, whose barrier needs a device guess.
  std::vector<torch::Tensor> flag{torch::zeros({1}, collective_options(group))};
  wait_for(group.allreduce(flag), group.getRank(), what);
}

}  // namespace gradaccum::dist
