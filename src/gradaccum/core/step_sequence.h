// The optimizer step, once per window, in the order DESIGN.md §1 fixes:
//   clip by global norm (norm before and after) → optimizer step →
//   zero the gradients → scheduler step.
// (fp16's unscale / inf-check / scaler update will wrap this sequence.)
// Parameters change here and nowhere else: only after a window's last micro-step.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "gradaccum/optim/lr_schedule.h"

namespace gradaccum::core {

struct StepResult {
  torch::Tensor grad_norm;          // before clipping, 0-dim float64
  torch::Tensor grad_norm_clipped;  // after clipping, 0-dim float64
  double lr = 0.0;                  // the learning rate this step used
};

class StepSequence {
 public:
  // Sets the optimizer's learning rate to schedule.at(first_step).
  StepSequence(torch::optim::Optimizer& optimizer, std::vector<torch::Tensor> params,
               optim::LrSchedule schedule, double max_grad_norm, int64_t first_step = 0);

  // Performs optimizer step number `step()` and advances to the next.
  StepResult apply();
  // Counts step `step()` without changing the parameters (a window skipped for
  // a non-finite loss): the gradients are released and the schedule advances,
  // since the window's data was consumed.
  void skip();
  // Continues a resumed run at `step` (sets the schedule's learning rate).
  void resume_at(int64_t step);
  int64_t step() const { return step_; }
  const optim::LrSchedule& schedule() const { return schedule_; }

 private:
  torch::optim::Optimizer& optimizer_;
  std::vector<torch::Tensor> params_;
  optim::LrSchedule schedule_;
  double max_grad_norm_;
  int64_t step_;
};

}  // namespace gradaccum::core
