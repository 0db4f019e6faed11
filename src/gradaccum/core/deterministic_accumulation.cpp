#include "gradaccum/core/deterministic_accumulation.h"

#include "gradaccum/base/check.h"

namespace gradaccum::core {

DeterministicAccumulation::DeterministicAccumulation(std::vector<torch::Tensor> params, WindowPlan& plan, int64_t rank,
                                                     torch::Device device)
    : params_(std::move(params)), plan_(plan), rank_(rank), device_(device) {
  plan.set_chunk_order(ChunkOrder::contiguous);
}

void DeterministicAccumulation::begin_window(WindowState&) {
  tree_.emplace(plan_.geometry().accumulation_steps());
  take_gradients();  // what the last optimizer step left (zeros) is no slot's
}

void DeterministicAccumulation::after_backward() { tree_->add(take_gradients()); }

void DeterministicAccumulation::skip_micro_step() { tree_->skip(); }

void DeterministicAccumulation::contribute(WindowTotals& totals, WindowState& w) {
  // The slots of this rank's share of a partial window's missing chunks, then the tree's root.
  const int64_t slots = plan_.geometry().accumulation_steps(), world = plan_.geometry().world_size();
  for (int64_t s = w.window.micro_steps(); s < slots; ++s) tree_->skip();
  auto root = tree_->finish();
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].mutable_grad() = root.empty() ? torch::Tensor() : std::move(root[i]);
  }
  // Each slot's loss sum and count, this rank's at its slots: summed over ranks they are exact
  // (one rank holds each slot).
  const int64_t first = w.window.slot(0, rank_), all = slots * world;
  const auto options = totals.loss.options();
  totals.slot_loss_sums = slot_vector(w.micro_sums, first, all, device_).to(options);
  totals.slot_counts = slot_vector(w.micro_items, first, all, device_).to(options);
}

void DeterministicAccumulation::after_reduce(WindowTotals& totals, WindowState&) {
  totals.loss.narrow(0, 0, 1).copy_(canonical_sum(totals.slot_loss_sums).reshape({1}));
  totals.loss.narrow(0, 1, 1).copy_(canonical_sum(totals.slot_counts).reshape({1}));
}

std::vector<torch::Tensor> DeterministicAccumulation::take_gradients() {
  std::vector<torch::Tensor> gradients;
  gradients.reserve(params_.size());
  for (auto& p : params_) {
    gradients.push_back(p.grad());
    p.mutable_grad() = torch::Tensor();
  }
  return gradients;
}

}  // namespace gradaccum::core
