#include "gradaccum/core/loss_normalizer.h"

namespace gradaccum::core {

LossNormalizer::LossNormalizer(LossNormalization mode, int64_t accumulation_steps)
    : mode_(mode), accumulation_steps_(accumulation_steps) {}

void LossNormalizer::begin_window() {
  sum_ = torch::Tensor();
  count_ = torch::Tensor();
  naive_terms_ = torch::Tensor();
}

namespace {
// Running float64 sum of 0-dim tensors; the first term allocates on its device.
// add_ converts the term to float64 inside the kernel (type promotion), and
// NoGradGuard keeps the total out of the graph: no detached view and no
// converted temporary per micro-step (this runs on every micro-step).
void accumulate(torch::Tensor& total, const torch::Tensor& term) {
  torch::NoGradGuard no_grad;
  if (total.defined()) {
    total.add_(term);
  } else {
    total = term.to(torch::kDouble, /*non_blocking=*/false, /*copy=*/true);
  }
}
}  // namespace

torch::Tensor LossNormalizer::objective(const LossSum& micro) {
  accumulate(sum_, micro.sum);
  accumulate(count_, micro.count);
  if (mode_ != LossNormalization::micro_batch) {
    // Scale last: backward the plain sum; finish() divides by the window count.
    return micro.sum;
  }
  // Naive: this micro-batch's mean, divided by the configured N (seed 000's loop).
  // clamp_min keeps a micro-batch with no items at loss 0 instead of 0/0.
  auto term = micro.sum / (micro.count.clamp_min(1).to(micro.sum.scalar_type()) *
                           static_cast<double>(accumulation_steps_));
  accumulate(naive_terms_, term);
  return term;
}

torch::Tensor LossNormalizer::local_totals() const {
  auto zero = [&](const torch::Tensor& t) {
    return t.defined() ? t : torch::zeros({}, torch::kDouble);
  };
  auto device = sum_.defined() ? sum_.device() : torch::Device(torch::kCPU);
  return torch::stack({zero(sum_).to(device), zero(count_).to(device), zero(naive_terms_).to(device)});
}

void LossNormalizer::restore(const torch::Tensor& totals) {
  auto t = totals.to(torch::kDouble);
  sum_ = t[0].clone();
  count_ = t[1].clone();
  naive_terms_ = t[2].clone();
}

WindowLoss LossNormalizer::finish(const torch::Tensor& global_totals,
                                  const std::vector<torch::Tensor>& params,
                                  int64_t world_size, double loss_multiplier) const {
  auto total_sum = global_totals[0];
  auto total_count = global_totals[1];
  auto divide_gradients = [&](double divisor) {
    if (divisor == 1.0) return;
    for (const auto& p : params) {
      if (p.grad().defined()) p.grad().div_(divisor);
    }
  };
  if (mode_ == LossNormalization::window) {
    // The gradients hold ∇Σ sums (over micro-steps and ranks), times the loss
    // multiplier: one division by multiplier × global count makes them
    // ∇(Σ sums / Σ counts). A window without items (everything ignored) has
    // zero gradients; clamp avoids 0/0.
    auto inverse = (total_count.clamp_min(1.0) * loss_multiplier).reciprocal();
    torch::Tensor scale;  // `inverse` in the gradients' dtype, converted once
    for (const auto& p : params) {
      auto g = p.grad();
      if (!g.defined()) continue;
      if (!scale.defined() || scale.scalar_type() != g.scalar_type()) scale = inverse.to(g.scalar_type());
      g.mul_(scale);
    }
    return {total_sum / total_count.clamp_min(1.0), total_count};
  }
  if (mode_ == LossNormalization::sum) {
    divide_gradients(loss_multiplier);
    return {total_sum, total_count};
  }
  // Naive: every rank backwarded mean / N; ranks are averaged as DDP does.
  divide_gradients(static_cast<double>(world_size) * loss_multiplier);
  return {global_totals[2] / static_cast<double>(world_size), total_count};
}

}  // namespace gradaccum::core
