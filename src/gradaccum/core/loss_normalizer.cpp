#include "gradaccum/core/loss_normalizer.h"

namespace gradaccum::core {

const base::EnumNames<LossNormalization>& loss_normalization_names() {
  static const base::EnumNames<LossNormalization> names{{LossNormalization::window, "window"},
                                                        {LossNormalization::sum, "sum"},
                                                        {LossNormalization::micro_batch, "micro_batch"}};
  return names;
}

std::string to_string(LossNormalization normalization) { return loss_normalization_names().name(normalization); }

LossNormalizer::LossNormalizer(LossNormalization mode, int64_t accumulation_steps)
    : mode_(mode), accumulation_steps_(accumulation_steps) {}

void LossNormalizer::begin_window() {
  sum_ = torch::Tensor();
  count_ = torch::Tensor();
  naive_terms_ = torch::Tensor();
}

namespace {
// total += term, outside the graph, in the term's dtype widened to float32
// when narrower (bf16, fp16). The first term starts the total. A total put
// back by restore() (float64, holding a value of that dtype) returns to it
// first, so a resumed window adds exactly as the uninterrupted one did.
void accumulate(torch::Tensor& total, const torch::Tensor& term) {
  torch::NoGradGuard no_grad;
  const bool narrow_float = term.is_floating_point() && term.element_size() < 4;
  const auto dtype = narrow_float ? torch::kFloat : term.scalar_type();
  if (!total.defined()) {
    total = term.to(dtype, /*non_blocking=*/false, /*copy=*/true);
    return;
  }
  if (total.scalar_type() != dtype) total = total.to(dtype);
  total.add_(term);
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
  auto term =
      micro.sum / (micro.count.clamp_min(1).to(micro.sum.scalar_type()) * static_cast<double>(accumulation_steps_));
  accumulate(naive_terms_, term);
  return term;
}

torch::Tensor LossNormalizer::local_totals() const {
  torch::NoGradGuard no_grad;
  const auto device = sum_.defined() ? sum_.device() : torch::Device(torch::kCPU);
  auto float64 = [&](const torch::Tensor& t) {
    return t.defined() ? t.to(device, torch::kDouble)
                       : torch::zeros({}, torch::TensorOptions(torch::kDouble).device(device));
  };
  return torch::stack({float64(sum_), float64(count_), float64(naive_terms_)});
}

void LossNormalizer::restore(const torch::Tensor& totals) {
  auto t = totals.to(torch::kDouble);
  sum_ = t[0].clone();
  count_ = t[1].clone();
  naive_terms_ = t[2].clone();
}

WindowLoss LossNormalizer::finish(const torch::Tensor& global_totals, const std::vector<torch::Tensor>& gradients,
                                  int64_t world_size, double loss_multiplier) const {
  auto total_sum = global_totals[0];
  auto total_count = global_totals[1];
  auto divide_gradients = [&](double divisor) {
    if (divisor == 1.0) return;
    for (const auto& g : gradients) {
      if (g.defined()) g.div_(divisor);
    }
  };
  if (mode_ == LossNormalization::window) {
    // The gradients hold ∇Σ sums (over micro-steps and ranks), times the loss
    // multiplier: one division by multiplier × global count makes them
    // ∇(Σ sums / Σ counts). A window without items (everything ignored) has
    // zero gradients; clamp avoids 0/0.
    auto inverse = (total_count.clamp_min(1.0) * loss_multiplier).reciprocal();
    torch::Tensor scale;  // `inverse` in the gradients' dtype, converted once
    for (const auto& g : gradients) {
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
