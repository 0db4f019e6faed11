#include "gradaccum/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "gradaccum/base/check.h"

namespace gradaccum::optim {

const base::EnumNames<ScheduleType>& schedule_type_names() {
  static const base::EnumNames<ScheduleType> names{
      {ScheduleType::constant, "constant"}, {ScheduleType::linear, "linear"}, {ScheduleType::cosine, "cosine"}};
  return names;
}

std::string to_string(ScheduleType type) { return schedule_type_names().name(type); }

LrSchedule::LrSchedule(ScheduleType type, double peak_lr, int64_t warmup_steps, int64_t total_steps)
    : type_(type), peak_lr_(peak_lr), warmup_steps_(warmup_steps), total_steps_(total_steps) {
  GA_CHECK(peak_lr >= 0.0, "learning_rate must be >= 0, got {}", peak_lr);
  GA_CHECK(warmup_steps >= 0, "warmup_steps must be >= 0, got {}", warmup_steps);
  GA_CHECK(total_steps >= 1, "the run has {} optimizer steps; it needs at least 1", total_steps);
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps_) {
    return peak_lr_ * static_cast<double>(step) / static_cast<double>(warmup_steps_);
  }
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, total_steps_ - warmup_steps_));
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps_) / decay_steps);
  switch (type_) {
    case ScheduleType::constant:
      return peak_lr_;
    case ScheduleType::linear:
      return peak_lr_ * (1.0 - progress);
    case ScheduleType::cosine:
      return peak_lr_ * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  return peak_lr_;
}

}  // namespace gradaccum::optim
