// The one owner of loss normalization (DESIGN.md §1).
//
// `window` (exact): every micro-step backwards its loss *sum*; after the last
// micro-step (and after the gradients were summed over ranks) the gradients are
// divided once by the window's total item count over all micro-steps and ranks.
// The gradient is then ∇(Σ sums / Σ counts), whatever the split. We chose
// "scale last" over "count first" because the count is then the very count the
// loss produced with its own mask (after the causal shift, with ignore_index),
// it needs no look-ahead over the window's data and no extra collective before
// the first backward. Under fp16 the dynamic loss scaler absorbs the larger
// magnitude of summed gradients.
//
// `sum`: the window loss is Σ sums, unnormalized (ggml's SUM loss type; for
// objectives that are sums by definition). Gradients are left as accumulated.
//
// `micro_batch` (naive, for comparison only): each micro-step backwards
// mean / N with N = the configured accumulation steps, as the PyTorch loop of
// seed 000 does. Wrong whenever micro-batches hold different counts.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "gradaccum/base/enum_names.h"
#include "gradaccum/core/batch.h"

namespace gradaccum::core {

enum class LossNormalization { window, sum, micro_batch };

// The config key's spelling: "window", "sum", "micro_batch".
const base::EnumNames<LossNormalization>& loss_normalization_names();
std::string to_string(LossNormalization normalization);

// The window's loss figures after normalization (0-dim tensors, not yet on host).
struct WindowLoss {
  torch::Tensor loss;   // the reported window loss (float64)
  torch::Tensor count;  // Σ counts over micro-steps and ranks (float64)
};

class LossNormalizer {
 public:
  LossNormalizer(LossNormalization mode, int64_t accumulation_steps);

  LossNormalization mode() const { return mode_; }
  void begin_window();
  // The scalar to backward for one micro-batch; records its sum and count.
  torch::Tensor objective(const LossSum& micro);
  // Local totals to be summed over ranks: [Σ sum, Σ count, Σ naive_terms].
  torch::Tensor local_totals() const;
  // Puts back local_totals() saved inside a window (resuming a preempted run).
  void restore(const torch::Tensor& totals);
  // Given the totals summed over ranks, scales the (summed) gradients once and
  // returns the window loss. `gradients`: the tensors holding them on this rank
  // (GradSync::gradients: every parameter's .grad, or this rank's shard). `loss_multiplier` is the factor each
  // objective() was multiplied by before backward (the fp16 loss scale): it is divided out in the same pass. Device
  // tensors only: no host synchronization.
  WindowLoss finish(const torch::Tensor& global_totals, const std::vector<torch::Tensor>& gradients, int64_t world_size,
                    double loss_multiplier = 1.0) const;

 private:
  LossNormalization mode_;
  int64_t accumulation_steps_;
  // Running totals of the window, each in its terms' dtype widened to at
  // least float32 (as Accelerate and llm.c accumulate the logged loss):
  // adding a term of the same dtype is one cheap operator per micro-step,
  // where a float64 total made every addition convert its term first.
  // local_totals() reports them in float64.
  torch::Tensor sum_;          // Σ loss sums
  torch::Tensor count_;        // Σ counts
  torch::Tensor naive_terms_;  // Σ mean / N (micro_batch mode's reported loss)
};

}  // namespace gradaccum::core
