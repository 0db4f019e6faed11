// Deciding where a preempted run stops: inside the window in flight, or at its end.
//
// A rank asked to stop (SIGTERM/SIGINT) wants to finish its micro-step in
// flight and save the partial window. Alone, it can. With several ranks it may
// stop inside the window only if no rank has yet entered the window's last
// micro-step, whose backward starts the gradient all-reduce: a rank that
// entered would wait there for the one that left. So each rank consults the
// agreement at every micro-step boundary and before its last micro-step, and
// the first decision for a window (stop, or go on into the all-reduce) binds
// every rank. A stop that comes too late is carried to the window's end by the
// flag that travels with the loss totals (Trainer).
#pragma once

#include <cstdint>

namespace gradaccum::core {

class StopAgreement {
 public:
  virtual ~StopAgreement() = default;
  // At a micro-step boundary of window `window` (an id unique within a run:
  // the optimizer step it will become). `requested`: this rank was asked to
  // stop. `entering_last`: the next micro-step is the window's last. Returns
  // true when the rank must stop here, keeping its partial window.
  virtual bool stop_here(int64_t window, bool requested, bool entering_last) = 0;
  // The window's all-reduce completed on every rank (a place to forget it).
  virtual void window_finished(int64_t window) {}
};

// One process: it stops where it is asked to.
class LocalStopAgreement final : public StopAgreement {
 public:
  bool stop_here(int64_t, bool requested, bool) override { return requested; }
};

}  // namespace gradaccum::core
