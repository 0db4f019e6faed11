// The optimizer step, once per window, in the order DESIGN.md §1 fixes:
//   (fp16: check the unscaled gradients for inf/nan; skip and back off if found)
//   → clip by global norm (norm before and after) → optimizer step →
//   zero the gradients → scheduler step → (fp16: scaler update).
// Parameters change here and nowhere else: only after a window's last micro-step.
//
// Two counters: step() counts windows consumed (what max_steps and the logs
// count); schedule_step() is the LR schedule's position, which advances with
// every update and with a nan_policy skip (the window's data was consumed) but
// not with an fp16 overflow skip: those are the scaler calibrating itself, and
// counting them would eat into warm-up (the HF Trainer and Accelerate do not
// step the scheduler after an overflow either).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "gradaccum/optim/loss_scaler.h"
#include "gradaccum/optim/lr_schedule.h"

namespace gradaccum::core {

struct StepResult {
  torch::Tensor grad_norm;          // before clipping, 0-dim float64 (unscaled under fp16)
  torch::Tensor grad_norm_clipped;  // after clipping, 0-dim float64
  double lr = 0.0;                  // the learning rate this step used (or would have)
  bool overflow = false;            // fp16: inf/nan in the gradients; the update was skipped
  double loss_scale = 0.0;          // fp16: the scale this window's losses were multiplied by
};

class StepSequence {
 public:
  // Sets the optimizer's learning rate to schedule.at(0). `scaler` (fp16 only,
  // may be null) must outlive this object.
  StepSequence(torch::optim::Optimizer& optimizer, std::vector<torch::Tensor> params, optim::LrSchedule schedule,
               double max_grad_norm, optim::LossScaler* scaler = nullptr);

  // Performs optimizer step number `step()` on gradients that are already
  // normalized and unscaled, and advances to the next. With a scaler it first
  // reads the gradient norm on the host (the one extra synchronization fp16
  // costs) to decide whether to update at all.
  StepResult apply();
  // The same on `gradients`, the tensors holding the window's gradient on this rank
  // (GradSync::gradients), whose norm over all ranks is `norm` (GradSync::global_norm).
  StepResult apply(const std::vector<torch::Tensor>& gradients, const torch::Tensor& norm);
  // Counts step `step()` without changing the parameters (a window skipped for
  // a non-finite loss): the gradients are released and the schedule advances,
  // since the window's data was consumed. The result holds the rate the step
  // would have used, zero norms and (fp16) the scale in force.
  StepResult skip();
  // Continues a resumed run.
  void resume_at(int64_t step, int64_t schedule_step);
  int64_t step() const { return step_; }
  int64_t schedule_step() const { return schedule_step_; }
  const optim::LrSchedule& schedule() const { return schedule_; }

 private:
  void release_gradients();

  torch::optim::Optimizer& optimizer_;
  std::vector<torch::Tensor> params_;
  optim::LrSchedule schedule_;
  double max_grad_norm_;
  optim::LossScaler* scaler_;
  int64_t step_ = 0;
  int64_t schedule_step_ = 0;
};

}  // namespace gradaccum::core
