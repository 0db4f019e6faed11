// deterministic_accumulation: the GradAccumulator that adds a window's micro-batch gradients in
// the canonical tree (canonical_sum.h), so that for a fixed micro-batch size the gradients and
// losses are bit-identical for every N × W with W a power of two.
//
// Each micro-step's gradient is taken out of .grad after its backward and kept apart; at the
// window's end the rank's subtree root goes back into .grad for the cross-rank reduction (which
// pairs ranks in the same tree, dist/tree_grad_sync.h). The window's loss sum and count are
// added in the same tree: every rank puts its slots' figures into the window's totals, the
// all-reduce makes each slot exact (one rank holds each), and after it every rank adds the slots
// in the canonical order in place of the ranks' running totals. The tree's partial sums are not
// checkpointed, so a stop request waits for the window's end.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "gradaccum/core/canonical_sum.h"
#include "gradaccum/core/window_feature.h"
#include "gradaccum/core/window_plan.h"

namespace gradaccum::core {

class DeterministicAccumulation final : public GradAccumulator {
 public:
  // Sets the plan's chunks to the contiguous order the tree's slots follow (its rules, a world
  // size that is a power of two and no micro_batch normalization, are validate()'s:
  // trainer_options.h). `plan` must outlive this object.
  DeterministicAccumulation(std::vector<torch::Tensor> params, WindowPlan& plan, int64_t rank, torch::Device device);

  void begin_window(WindowState& w) override;
  void after_backward() override;
  void skip_micro_step() override;
  bool can_stop_inside_window() const override { return false; }
  // The rank's subtree root into .grad; the slots' loss sums and counts into the totals.
  void contribute(WindowTotals& totals, WindowState& w) override;
  // The window's loss sum and count in the canonical tree.
  void after_reduce(WindowTotals& totals, WindowState& w) override;

 private:
  // This micro-step's gradients, taken out of .grad (which is then empty for the next backward).
  std::vector<torch::Tensor> take_gradients();

  std::vector<torch::Tensor> params_;
  const WindowPlan& plan_;
  int64_t rank_;
  torch::Device device_;
  std::optional<CanonicalGradientSum> tree_;
};

}  // namespace gradaccum::core
