#include "gradaccum/core/preemption.h"

#include "gradaccum/base/check.h"

namespace gradaccum::core {

Preemption::Preemption(std::vector<torch::Tensor> params, LossNormalizer& normalizer, torch::Device device,
                       bool inside_windows)
    : params_(std::move(params)), normalizer_(normalizer), device_(device), inside_windows_(inside_windows) {}

void PartialWindow::save(PieceState& piece) const {
  const auto long_scalar = [](int64_t v) { return torch::full({1}, v, torch::kLong); };
  piece.set_tensor("micro_step", long_scalar(micro_step));
  piece.set_tensor("grad_count", long_scalar(static_cast<int64_t>(grads.size())));
  piece.set_tensor("totals", totals);
  if (micro_items.defined()) piece.set_tensor("micro_items", micro_items);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) piece.set_tensor(fmt::format("grad.{:05d}", i), grads[i]);
  }
}

PartialWindow PartialWindow::restore(const PieceState& piece) {
  PartialWindow partial;
  partial.micro_step = piece.tensor_integer("micro_step");
  GA_CHECK(partial.micro_step > 0, "{} is {}, not a micro-step inside a window", piece.tensor_where("micro_step"),
           partial.micro_step);
  const int64_t grad_count = piece.tensor_integer("grad_count");
  GA_CHECK(grad_count >= 0, "{} is negative", piece.tensor_where("grad_count"));
  partial.totals = piece.tensor("totals");
  GA_CHECK(partial.totals.numel() == 3 && partial.totals.scalar_type() == torch::kDouble, "{} is not 3 float64 sums",
           piece.tensor_where("totals"));
  if (piece.has_tensor("micro_items")) {
    partial.micro_items = piece.tensor("micro_items");
    GA_CHECK(partial.micro_items.dim() == 1 && partial.micro_items.numel() == partial.micro_step &&
                 partial.micro_items.scalar_type() == torch::kDouble,
             "{} is not {} float64 counts", piece.tensor_where("micro_items"), partial.micro_step);
  }
  partial.grads.resize(static_cast<size_t>(grad_count));
  const std::string grad_prefix = "grad.";
  for (const auto& [name, tensor] : piece.tensors) {
    if (name.rfind(grad_prefix, 0) != 0) continue;
    const auto digits = name.substr(grad_prefix.size());
    GA_CHECK(!digits.empty() && digits.size() <= 9 && digits.find_first_not_of("0123456789") == std::string::npos,
             "{} has no gradient index", piece.tensor_where(name));
    const auto index = std::stoll(digits);
    GA_CHECK(index < grad_count, "{} is beyond grad_count {}", piece.tensor_where(name), grad_count);
    partial.grads[static_cast<size_t>(index)] = tensor;
  }
  return partial;
}

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
    stopped_partial_.micro_step = s;
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
  // Inside a window every rank keeps its own sums: ranks may have stopped after different
  // micro-steps, and their gradients differ until the window's all-reduce.
  if (stopped_after_ > 0) stopped_partial_.save(state.piece(kPiece));
}

PartialWindow Preemption::partial_window(const TrainingState& state) {
  return state.position.micro_step > 0 ? PartialWindow::restore(state.saved_piece(kPiece)) : PartialWindow{};
}

void Preemption::restore(const TrainingState& state) {
  if (state.position.micro_step == 0) return;
  GA_CHECK(inside_windows_,
           "checkpoint: it was saved inside a window (micro-step {}), whose sums this run cannot continue "
           "(deterministic_accumulation's tree order, or zero_stage 2's sharded_grad_sync: each_micro_step); "
           "resume it without them",
           state.position.micro_step);
  auto partial = partial_window(state);
  GA_CHECK(partial.grads.size() == params_.size(),
           "checkpoint: the partial window holds {} gradients for {} parameters", partial.grads.size(), params_.size());
  resume_ = std::move(partial);
}

}  // namespace gradaccum::core
