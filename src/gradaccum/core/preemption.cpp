#include "gradaccum/core/preemption.h"

#include "gradaccum/base/check.h"

namespace gradaccum::core {

Preemption::Preemption(std::vector<torch::Tensor> params, LossNormalizer& normalizer, const WindowPlan& plan,
                       torch::Device device, bool inside_windows)
    : params_(std::move(params)),
      normalizer_(normalizer),
      plan_(plan),
      device_(device),
      inside_windows_(inside_windows) {}

void Preemption::arm(const std::atomic<bool>* stop, StopAgreement* agreement) {
  stop_ = stop;
  agreement_ = agreement;
}

void Preemption::begin_window(WindowState& w) {
  stopped_ = false;
  stopped_after_ = 0;
  stopped_partial_ = PartialWindow{};
  w.stoppable = w.stoppable && stop_ != nullptr && agreement_ != nullptr && inside_windows_;
  if (w.first_micro_step == 0) return;
  // A window stopped inside: put its sums back.
  normalizer_.restore(resume_.totals.to(device_));
  const auto& restored = resume_.micro_items;
  w.micro_items_known = restored.defined() && restored.numel() == w.first_micro_step;
  for (int64_t s = 0; w.micro_items_known && s < w.first_micro_step; ++s) {
    w.micro_items.push_back(restored[s].to(device_, torch::kDouble));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& g = resume_.grads[i];
    if (g.defined()) params_[i].mutable_grad() = g.to(params_[i].device(), params_[i].scalar_type()).clone();
  }
  resume_ = PartialWindow{};
}

// Asked before each micro-step but the first one run here, and always before the last (with
// several ranks, entering it commits to the all-reduce).
bool Preemption::stop_before_micro_step(const WindowState& w, int64_t s, bool last) {
  if (!w.stoppable || !(s > w.first_micro_step || last) || !agreement_->stop_here(w.id, requested(), last)) {
    return false;
  }
  if (s > 0) {  // micro-step 0 has accumulated nothing: a plain checkpoint
    stopped_partial_.totals = normalizer_.local_totals().to(torch::kCPU);
    if (w.micro_items_known) stopped_partial_.micro_items = torch::stack(w.micro_items).to(torch::kCPU);
    for (const auto& p : params_) {
      stopped_partial_.grads.push_back(
          p.grad().defined() ? p.grad().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true) : torch::Tensor());
    }
  }
  stopped_after_ = s;
  stopped_ = true;
  return true;
}

void Preemption::contribute(WindowTotals& totals, WindowState&) {
  if (requested()) totals.stop_requests.fill_(1.0);
}

void Preemption::after_reduce(WindowTotals&, WindowState& w) {
  if (w.stoppable) agreement_->window_finished(w.id);
}

void Preemption::after_host_read(const WindowTotals& totals) { stop_agreed_ = host_value(totals.stop_requests) > 0.0; }

void Preemption::save(TrainingState& state) const {
  if (!stopped_) return;
  state.position.micro_step = stopped_after_;
  if (stopped_after_ > 0) state.partial = stopped_partial_;
}

void Preemption::restore(const TrainingState& state) {
  if (state.position.micro_step == 0) return;
  GA_CHECK(inside_windows_,
           "checkpoint: it was saved inside a window (micro-step {}), whose sums this run cannot continue "
           "(deterministic_accumulation's tree order, or zero_stage 2's sharded_grad_sync: each_micro_step); "
           "resume it without them",
           state.position.micro_step);
  // The partial sums belong to particular micro-batches of particular ranks.
  const auto& g = plan_.geometry();
  GA_CHECK(state.micro_batch == g.micro_batch() && state.accumulation_steps == g.accumulation_steps() &&
               state.world_size == g.world_size(),
           "checkpoint: it was saved inside a window with {}x{}x{} (b x N x W); resume it with the "
           "same decomposition, not {}x{}x{}",
           state.micro_batch, state.accumulation_steps, state.world_size, g.micro_batch(), g.accumulation_steps(),
           g.world_size());
  GA_CHECK(state.partial.grads.size() == params_.size() && state.partial.totals.defined(),
           "checkpoint: the partial window holds {} gradients for {} parameters", state.partial.grads.size(),
           params_.size());
  resume_ = state.partial;
}

}  // namespace gradaccum::core
