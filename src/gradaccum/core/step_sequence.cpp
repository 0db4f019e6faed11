#include "gradaccum/core/step_sequence.h"

#include <cmath>

#include "gradaccum/optim/grad_clip.h"
#include "gradaccum/optim/optimizer_factory.h"

namespace gradaccum::core {

StepSequence::StepSequence(torch::optim::Optimizer& optimizer, std::vector<torch::Tensor> params,
                           optim::LrSchedule schedule, double max_grad_norm, optim::LossScaler* scaler)
    : optimizer_(optimizer),
      params_(std::move(params)),
      schedule_(schedule),
      max_grad_norm_(max_grad_norm),
      scaler_(scaler) {
  optim::set_learning_rate(optimizer_, schedule_.at(schedule_step_));
}

void StepSequence::release_gradients() {
  // Zero by releasing the gradients (PyTorch's set_to_none): the next window's
  // first backward then writes instead of adding, and no memset is spent.
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
}

StepResult StepSequence::apply() {
  std::vector<torch::Tensor> grads;
  grads.reserve(params_.size());
  for (const auto& p : params_) grads.push_back(p.grad());
  return apply(grads, optim::tensors_norm(grads));
}

StepResult StepSequence::apply(const std::vector<torch::Tensor>& gradients, const torch::Tensor& norm) {
  StepResult result;
  result.lr = schedule_.at(schedule_step_);
  if (scaler_ != nullptr) {
    result.loss_scale = scaler_->scale();
    // The float64 norm of finite float32 gradients is finite, so a non-finite
    // norm means an inf or nan in some gradient: one reduction checks them all.
    result.overflow = !std::isfinite(norm.item<double>());
    if (result.overflow) {
      release_gradients();  // parameters and optimizer state stay untouched
      ++step_;
      scaler_->update(/*found_inf=*/true);
      result.grad_norm = norm;
      result.grad_norm_clipped = norm;
      return result;
    }
  }
  auto clip = optim::clip_gradients(gradients, max_grad_norm_, norm);
  result.grad_norm = clip.norm_before;
  result.grad_norm_clipped = clip.norm_after;
  optimizer_.step();
  release_gradients();
  ++step_;
  ++schedule_step_;
  optim::set_learning_rate(optimizer_, schedule_.at(schedule_step_));  // the scheduler step
  if (scaler_ != nullptr) scaler_->update(/*found_inf=*/false);
  return result;
}

void StepSequence::resume_at(int64_t step, int64_t schedule_step) {
  step_ = step;
  schedule_step_ = schedule_step;
  optim::set_learning_rate(optimizer_, schedule_.at(schedule_step_));
}

StepResult StepSequence::skip() {
  StepResult result;
  result.lr = schedule_.at(schedule_step_);
  result.grad_norm = torch::zeros({}, torch::kDouble);
  result.grad_norm_clipped = result.grad_norm;
  if (scaler_ != nullptr) result.loss_scale = scaler_->scale();
  release_gradients();
  ++step_;
  ++schedule_step_;
  optim::set_learning_rate(optimizer_, schedule_.at(schedule_step_));
  return result;
}

}  // namespace gradaccum::core
