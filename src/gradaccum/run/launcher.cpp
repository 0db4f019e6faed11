#include "gradaccum/run/launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "gradaccum/base/check.h"
#include "gradaccum/run/stop_signals.h"

namespace gradaccum::run {

namespace {

// A port the kernel reports free on 127.0.0.1 (bound and released at once).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  GA_CHECK(fd >= 0, "--nproc: cannot open a socket: {}", std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  close(fd);
  GA_CHECK(ok, "--nproc: cannot find a free port: {}", std::strerror(errno));
  return ntohs(address.sin_port);
}

std::string describe(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

// The ranks, for the signal handler: a SIGTERM sent to the launcher is passed
// on, so every rank stops at the same window and saves (torchrun does the
// same). SIGINT from a terminal already reaches the whole process group, so the
// launcher only survives it and waits. Plain array: a handler may only make
// async-signal-safe calls.
constexpr int kMaxRanks = 1024;
pid_t g_children[kMaxRanks];
volatile sig_atomic_t g_child_count = 0;
std::atomic<int64_t> g_first_forward_ns{0};

// Copies of one request (GNU `timeout` signals the launcher and then its process group) are
// passed on once, by the rule the ranks apply (run/stop_signals.h): the launcher never turns one
// request into two. A deliberate second request is passed on as well.
extern "C" void forward_signal(int signal_number) {
  const int64_t now = monotonic_ns();
  const int64_t first = g_first_forward_ns.load();
  if (!is_new_stop_request(first, now)) return;
  if (first == 0) g_first_forward_ns.store(now);
  for (int i = 0; i < g_child_count; ++i) kill(g_children[i], signal_number);
}

extern "C" void ignore_signal(int) {}

}  // namespace

int launch_local(int64_t nproc, const std::vector<std::string>& child_args) {
  GA_CHECK(nproc <= kMaxRanks, "--nproc {}: at most {} local ranks", nproc, kMaxRanks);
  const int port = free_port();
  // Before the first fork, so that a SIGTERM arriving while the ranks start reaches those started.
  struct sigaction action {};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  action.sa_handler = ignore_signal;
  sigaction(SIGINT, &action, nullptr);

  const pid_t launcher = getpid();
  std::map<pid_t, int64_t> ranks;
  for (int64_t rank = 0; rank < nproc; ++rank) {
    const pid_t pid = fork();
    GA_CHECK(pid >= 0, "--nproc: fork failed: {}", std::strerror(errno));
    if (pid == 0) {
      // A rank dies with its launcher (a SIGKILLed launcher must not leave ranks training into
      // output_dir), also when the launcher died before this line: checked once it is set.
      if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(127);
      // The launcher's handlers are not the rank's (exec resets them too; this covers the moment
      // before it).
      ::signal(SIGTERM, SIG_DFL);
      ::signal(SIGINT, SIG_DFL);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv;
      std::string self = "gradaccum";
      argv.push_back(self.data());
      std::vector<std::string> args = child_args;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      std::fprintf(stderr, "gradaccum: error: --nproc: cannot start rank %ld: %s\n", static_cast<long>(rank),
                   std::strerror(errno));
      _exit(127);
    }
    ranks[pid] = rank;
    g_children[g_child_count] = pid;
    g_child_count = g_child_count + 1;
  }

  int exit_code = 0;
  while (!ranks.empty()) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const auto it = ranks.find(pid);
    if (it == ranks.end()) continue;
    const int64_t rank = it->second;
    ranks.erase(it);
    const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (failed && exit_code == 0) {
      exit_code = 1;
      std::fprintf(stderr, "gradaccum: error: rank %ld %s; stopping the other ranks\n", static_cast<long>(rank),
                   describe(status).c_str());
      // Ask politely, then insist: a rank blocked in a collective may not listen.
      for (const auto& [other, r] : ranks) kill(other, SIGTERM);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!ranks.empty() && std::chrono::steady_clock::now() < deadline) {
        const pid_t done = waitpid(-1, &status, WNOHANG);
        if (done > 0) {
          ranks.erase(done);
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
      for (const auto& [other, r] : ranks) kill(other, SIGKILL);
    }
  }
  return exit_code;
}

}  // namespace gradaccum::run
