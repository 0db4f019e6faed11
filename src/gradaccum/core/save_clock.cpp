#include "gradaccum/core/save_clock.h"

namespace gradaccum::core {

SaveClock::SaveClock(double interval_s) : interval_s_(interval_s), last_save_(Clock::now()) {}

void SaveClock::contribute(WindowTotals& totals, WindowState&) {
  if (interval_s_ <= 0.0) return;
  const std::chrono::duration<double> age = Clock::now() - last_save_;
  if (age.count() >= interval_s_) totals.save_requests.fill_(1.0);
}

void SaveClock::after_host_read(const WindowTotals& totals) {
  due_ = interval_s_ > 0.0 && host_value(totals.save_requests) > 0.0;
}

void SaveClock::saved() {
  last_save_ = Clock::now();
  due_ = false;
}

}  // namespace gradaccum::core
