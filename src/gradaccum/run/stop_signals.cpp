#include "gradaccum/run/stop_signals.h"

#include <signal.h>
#include <time.h>

namespace gradaccum::run {

namespace {
std::atomic<bool> g_stop_requested{false};
std::atomic<int64_t> g_first_request_ns{0};
static_assert(std::atomic<int64_t>::is_always_lock_free, "the signal handler needs a lock-free clock stamp");

extern "C" void request_stop(int signal_number) {
  const int64_t now = monotonic_ns();
  int64_t first = 0;
  if (g_first_request_ns.compare_exchange_strong(first, now)) {
    g_stop_requested.store(true);
    return;
  }
  if (!is_new_stop_request(first, now)) return;  // a copy of the first request
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}
}  // namespace

int64_t monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t ns = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
  return ns == 0 ? 1 : ns;
}

const std::atomic<bool>& install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = request_stop;
  sigemptyset(&action.sa_mask);
  // Both signals blocked while either handler runs: a SIGINT and a SIGTERM of one request
  // (a terminal's Ctrl-C and a supervisor's kill) never race in the handler.
  sigaddset(&action.sa_mask, SIGTERM);
  sigaddset(&action.sa_mask, SIGINT);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  return g_stop_requested;
}

namespace {
const std::atomic<bool>& install_cleared(struct sigaction& previous_term, struct sigaction& previous_int) {
  sigaction(SIGTERM, nullptr, &previous_term);
  sigaction(SIGINT, nullptr, &previous_int);
  g_first_request_ns.store(0);
  g_stop_requested.store(false);
  return install_stop_signals();
}
}  // namespace

StopSignalsScope::StopSignalsScope() : requested_(install_cleared(previous_term_, previous_int_)) {}

StopSignalsScope::~StopSignalsScope() {
  // A run that a request stopped keeps the handlers: the request's later copies (timeout's
  // second one, a supervisor's) must still count once after the run has saved and returned.
  if (g_first_request_ns.load() != 0) return;
  sigaction(SIGTERM, &previous_term_, nullptr);
  sigaction(SIGINT, &previous_int_, nullptr);
}

}  // namespace gradaccum::run
