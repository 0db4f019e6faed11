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

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "gradaccum/base/check.h"
#include "gradaccum/dist/peer_addresses.h"

namespace gradaccum::dist {

namespace {

using Clock = std::chrono::steady_clock;

// c10d logs each failed rendezvous attempt to stderr with a C++ stack trace (some 35 lines for two
// attempts) before it throws; the rendezvous is reported in one line instead (the exception's first
// line), so c10's log threshold stays above ERROR while it runs.
// Rendezvous of several ranks in one process (threads) nest: the first raises the threshold,
// the last puts it back.
class QuietC10dLog {
 public:
  QuietC10dLog() {
    std::lock_guard<std::mutex> lock(mutex());
    if (depth()++ == 0) {
      saved() = FLAGS_caffe2_log_level;
      FLAGS_caffe2_log_level = std::max(saved(), c10::GLOG_FATAL);
    }
  }
  ~QuietC10dLog() {
    std::lock_guard<std::mutex> lock(mutex());
    if (--depth() == 0) FLAGS_caffe2_log_level = saved();
  }
  QuietC10dLog(const QuietC10dLog&) = delete;
  QuietC10dLog& operator=(const QuietC10dLog&) = delete;

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static int& depth() {
    static int d = 0;
    return d;
  }
  static int& saved() {
    static int level = 0;
    return level;
  }
};

// The cause in c10d's or Gloo's exception text, for a one-line message: its first line, without
// Gloo's "[/path/to/pair.cc:561] " source location, up to the end of its first sentence (Gloo goes
// on with advice and a joke).
std::string cause_of(const std::exception& e) {
  std::string text = e.what();
  text = text.substr(0, text.find('\n'));
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find("] ");
    if (close != std::string::npos && text.find(':') < close) text = text.substr(close + 2);
  }
  if (const auto end = text.find(". "); end != std::string::npos) text = text.substr(0, end + 1);
  return text;
}

std::chrono::milliseconds left_until(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

// Waits until something at host:port accepts a TCP connection, or `deadline`. c10d's own client
// retries past its timeout (a connect attempt, then a back-off delay of about two seconds, then
// another), so the wait for a store that is not up yet is done here, within dist_timeout.
// Returns "" once connected, else why not.
std::string wait_for_listener(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string why = "nothing accepted a connection";
  do {
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (rc != 0) return fmt::format("cannot resolve {}: {}", host, gai_strerror(rc));
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      int error = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
      if (error == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const auto wait_ms = static_cast<int>(std::min<int64_t>(left_until(deadline).count(), 1000));
        if (poll(&p, 1, wait_ms) == 1) {
          socklen_t length = sizeof(error);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
        } else {
          error = ETIMEDOUT;
        }
      }
      close(fd);
      if (error == 0) {
        freeaddrinfo(found);
        return "";
      }
      why = fmt::format("nothing accepted a connection ({})", std::strerror(error));
    }
    freeaddrinfo(found);
    std::this_thread::sleep_for(std::min(std::chrono::milliseconds(100), left_until(deadline)));
  } while (Clock::now() < deadline);
  return why;
}

// Shuts down (SHUT_RDWR) this process's TCP connections whose peer port is `port`: a blocking
// receive on one of them returns at once.
void shut_down_connections_to(int port) {
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return;
  while (const dirent* entry = readdir(fds)) {
    const int fd = std::atoi(entry->d_name);
    struct stat info {};
    if (fd <= 2 || fd == dirfd(fds) || fstat(fd, &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) continue;
    int peer_port = -1;
    if (peer.ss_family == AF_INET) peer_port = ntohs(reinterpret_cast<const sockaddr_in&>(peer).sin_port);
    if (peer.ss_family == AF_INET6) peer_port = ntohs(reinterpret_cast<const sockaddr_in6&>(peer).sin6_port);
    if (peer_port == port) shutdown(fd, SHUT_RDWR);
  }
  closedir(fds);
}

// c10d's store client waits for the server's first answer without a timeout: a program that
// accepts the connection and never answers would hold a rank forever. Past the deadline this
// watchdog shuts the connection down, and the waiting client throws. The client may connect
// again after a shutdown (it retries), so the watchdog keeps shutting new connections down
// every 100 ms until the client gives up.
class RendezvousWatchdog {
 public:
  RendezvousWatchdog(int port, Clock::time_point deadline)
      : thread_([this, port, deadline] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (woken_.wait_until(lock, deadline, [this] { return done_; })) return;
          fired_ = true;
          do {
            shut_down_connections_to(port);
          } while (!woken_.wait_for(lock, std::chrono::milliseconds(100), [this] { return done_; }));
        }) {}
  ~RendezvousWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    woken_.notify_all();
    thread_.join();
  }
  RendezvousWatchdog(const RendezvousWatchdog&) = delete;
  RendezvousWatchdog& operator=(const RendezvousWatchdog&) = delete;

  bool fired() {
    std::lock_guard<std::mutex> lock(mutex_);
    return fired_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable woken_;
  bool done_ = false;
  bool fired_ = false;
  std::thread thread_;
};

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
    throw Error(fmt::format("rank {}: cannot connect the Gloo process group: {}", env.rank, cause_of(e)));
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
    throw Error(fmt::format("rank {}: cannot connect the NCCL process group: {}", env.rank, cause_of(e)));
  }
}
#endif

}  // namespace

c10::TensorOptions collective_options(const c10d::Backend& group) {
  return torch::TensorOptions().device(group.getBackendName() == "nccl" ? torch::kCUDA : torch::kCPU);
}

Connection connect(const DistEnvironment& env, std::chrono::milliseconds timeout, c10::Device device) {
  const QuietC10dLog quiet;
  const auto deadline = Clock::now() + timeout;
  const auto failure = [&](const std::string& why) {
    return Error(fmt::format("rank {}: cannot rendezvous at MASTER_ADDR={} MASTER_PORT={} within {} s: {}", env.rank,
                             env.master_addr, env.master_port, timeout.count() / 1000, why));
  };
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env.master_port);
  options.isServer = env.rank == 0 && !env.agent_store;
  options.numWorkers = static_cast<size_t>(env.world_size);
  options.waitWorkers = true;
  if (!options.isServer) {
    const auto why = wait_for_listener(env.master_addr, env.master_port, deadline);
    if (!why.empty()) throw failure(why + "; is rank 0 running, and are MASTER_ADDR and MASTER_PORT its own?");
  }
  options.timeout = std::max(std::chrono::milliseconds(1), left_until(deadline));
  c10::intrusive_ptr<c10d::Store> store;
  {
    RendezvousWatchdog watchdog(env.master_port, deadline);
    try {
      store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    } catch (const std::exception& e) {
      if (watchdog.fired()) {
        throw failure(
            "a program there accepted the connection but never answered as a rendezvous store (another program "
            "may hold MASTER_PORT)");
      }
      throw failure(cause_of(e));
    }
    // Connected just as the watchdog shut the connection down: the store is of no use.
    if (watchdog.fired()) throw failure("the rendezvous store answered too late");
  }
  store->setTimeout(timeout);  // every later wait on the store (the stop agreement) has the whole timeout
  Connection made{nullptr, store};
#ifdef GRADACCUM_WITH_CUDA
  if (device.is_cuda()) made.group = make_nccl(store, env, timeout, device);
#endif
  if (!made.group) made.group = make_gloo(store, env, timeout);
  remember_peer_addresses(PeerAddresses::exchange(*made.group));
  return made;
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

int64_t min_over_ranks(c10d::Backend& group, int64_t value, const std::string& what) {
  std::vector<torch::Tensor> tensors{torch::full({1}, value, collective_options(group).dtype(torch::kLong))};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MIN;
  wait_for(group.allreduce(tensors, options), group.getRank(), what);
  return tensors[0].item<int64_t>();
}

void wait_for(const c10::intrusive_ptr<c10d::Work>& work, int64_t rank, const std::string& what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    throw Error(fmt::format("rank {}: {} failed, a peer rank died or stalled past dist_timeout: {}", rank, what,
                            peer_addresses().annotate(cause_of(e), static_cast<int>(rank))));
  }
}

void barrier(c10d::Backend& group, const std::string& what) {
  // An all-reduce of one element: Gloo's barrier() would do, but this works
  // unchanged on NCCL, whose barrier needs a device guess.
  std::vector<torch::Tensor> flag{torch::zeros({1}, collective_options(group))};
  wait_for(group.allreduce(flag), group.getRank(), what);
}

}  // namespace gradaccum::dist
