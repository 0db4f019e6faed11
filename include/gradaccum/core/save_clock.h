// Checkpoints every `save_interval_s` seconds of training, at a step every rank agrees on.
//
// Ranks' clocks differ, so no rank may decide alone: a rank whose clock says a save is due raises
// a flag in the window's totals (save_requests), every rank learns the sum from the all-reduce it
// makes anyway, and a sum above zero saves after that step on every rank. The clock restarts at
// every save, whatever caused it (save_steps, this clock, a resume). A timed save changes no
// state of training, so the trajectory does not depend on when it happens.
#pragma once

#include <chrono>

#include "gradaccum/core/window_feature.h"

namespace gradaccum::core {

class SaveClock final : public WindowFeature {
 public:
  using Clock = std::chrono::steady_clock;

  // `interval_s` <= 0: never due.
  explicit SaveClock(double interval_s);

  void contribute(WindowTotals& totals, WindowState& w) override;
  void after_host_read(const WindowTotals& totals) override;

  // The last window's totals said a timed save is due.
  bool due() const { return due_; }
  // A checkpoint was written: the next one is due interval_s from now.
  void saved();

 private:
  double interval_s_;
  Clock::time_point last_save_;
  bool due_ = false;
};

}  // namespace gradaccum::core
