// Learning-rate schedules as pure functions of the optimizer step.
//
// Schedules count optimizer steps (windows), never micro-steps: with
// accumulation N the schedule advances once per N micro-steps (seed 004).
// Warm-up is linear from 0 to the peak over `warmup_steps` optimizer steps for
// every schedule type; afterwards: constant, linear decay to 0 at
// `total_steps`, or half-cosine decay to 0 at `total_steps` (the shapes of HF
// Transformers' get_{constant,linear,cosine}_schedule_with_warmup).
#pragma once

#include <cstdint>
#include <string>

#include "gradaccum/base/enum_names.h"

namespace gradaccum::optim {

enum class ScheduleType { constant, linear, cosine };

// The config's spelling (lr_scheduler_type): "constant" | "linear" | "cosine".
const base::EnumNames<ScheduleType>& schedule_type_names();
std::string to_string(ScheduleType type);

class LrSchedule {
 public:
  LrSchedule(ScheduleType type, double peak_lr, int64_t warmup_steps, int64_t total_steps);
  // The learning rate optimizer step `step` (0-based) uses.
  double at(int64_t step) const;
  int64_t total_steps() const { return total_steps_; }
  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  ScheduleType type_;
  double peak_lr_;
  int64_t warmup_steps_;
  int64_t total_steps_;
};

}  // namespace gradaccum::optim
