// SIGTERM and SIGINT as a stop request: the training loop saves the window in flight and stops
// (core::Trainer::set_checkpointing). One request often arrives as several copies: GNU `timeout`
// signals its child and then the child's process group, and a process-group kill reaches each
// rank of a `--nproc` job directly and again through the launcher. Signals that arrive within
// kStopCopyInterval of the first one are therefore copies of it and count once. A signal later
// than that is a deliberate second request: it falls back to the default action, so a stuck run
// can still be interrupted.
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>

namespace gradaccum::run {

inline constexpr std::chrono::milliseconds kStopCopyInterval{2000};

// Installs the handlers and returns the flag they raise (the same flag for every call).
const std::atomic<bool>& install_stop_signals();

// The handlers for one run: installed with the flag and its first stamp cleared (a request that
// stopped an earlier run in this process is not this run's), and the handlers that were there
// before put back when it ends, unless a request stopped it: then the handlers stay, so that the
// request's late copies still count once (a second, deliberate request still ends the process).
class StopSignalsScope {
 public:
  StopSignalsScope();
  ~StopSignalsScope();
  StopSignalsScope(const StopSignalsScope&) = delete;
  StopSignalsScope& operator=(const StopSignalsScope&) = delete;

  const std::atomic<bool>& requested() const { return requested_; }

 private:
  struct sigaction previous_term_ {};
  struct sigaction previous_int_ {};
  const std::atomic<bool>& requested_;
};

// Whether a stop signal arriving at `now_ns` (CLOCK_MONOTONIC) is a new request rather than a copy
// of the one first seen at `first_ns` (0: none yet). The rule of the handlers above, and of the
// launcher's forwarding (run/launcher.h); async-signal-safe.
inline bool is_new_stop_request(int64_t first_ns, int64_t now_ns) {
  return first_ns == 0 || now_ns - first_ns > std::chrono::nanoseconds(kStopCopyInterval).count();
}

// CLOCK_MONOTONIC in nanoseconds, never 0; async-signal-safe (clock_gettime is).
int64_t monotonic_ns();

}  // namespace gradaccum::run
