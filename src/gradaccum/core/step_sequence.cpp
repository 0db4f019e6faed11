#include "gradaccum/core/step_sequence.h"

#include "gradaccum/optim/grad_clip.h"
#include "gradaccum/optim/optimizer_factory.h"

namespace gradaccum::core {

StepSequence::StepSequence(torch::optim::Optimizer& optimizer, std::vector<torch::Tensor> params,
                           optim::LrSchedule schedule, double max_grad_norm, int64_t first_step)
    : optimizer_(optimizer),
      params_(std::move(params)),
      schedule_(schedule),
      max_grad_norm_(max_grad_norm),
      step_(first_step) {
  optim::set_learning_rate(optimizer_, schedule_.at(step_));
}

StepResult StepSequence::apply() {
  StepResult result;
  result.lr = schedule_.at(step_);
  auto clip = optim::clip_grad_norm(params_, max_grad_norm_);
  result.grad_norm = clip.norm_before;
  result.grad_norm_clipped = clip.norm_after;
  optimizer_.step();
  // Zero by releasing the gradients (PyTorch's set_to_none): the next window's
  // first backward then writes instead of adding, and no memset is spent.
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  ++step_;
  optim::set_learning_rate(optimizer_, schedule_.at(step_));  // the scheduler step
  return result;
}

void StepSequence::resume_at(int64_t step) {
  step_ = step;
  optim::set_learning_rate(optimizer_, schedule_.at(step_));
}

void StepSequence::skip() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  ++step_;
  optim::set_learning_rate(optimizer_, schedule_.at(step_));
}

}  // namespace gradaccum::core
