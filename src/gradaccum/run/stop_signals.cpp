#include "gradaccum/run/stop_signals.h"

#include <signal.h>

namespace gradaccum::run {

namespace {
std::atomic<bool> g_stop_requested{false};

extern "C" void request_stop(int signal_number) {
  if (g_stop_requested.exchange(true)) {
    ::signal(signal_number, SIG_DFL);
    ::raise(signal_number);
  }
}
}  // namespace

const std::atomic<bool>& install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = request_stop;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  return g_stop_requested;
}

}  // namespace gradaccum::run
