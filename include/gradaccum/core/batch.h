// The two values that flow between data, models and the engine.
#pragma once

#include <torch/torch.h>

namespace gradaccum::core {

// Labels equal to this value contribute neither loss nor count (HF's convention). It belongs to
// the batch: data makes such labels (padding), losses skip them.
inline constexpr int64_t kIgnoreIndex = -100;

// Who the rows of a training micro-batch are. Per-sample randomness (models/sample_dropout.h) is a
// function of these and never of the micro-batch a sample lands in, so that it does not depend
// on how a window is cut into micro-batches and ranks.
struct SampleKeys {
  torch::Tensor ids;  // int64 [rows]: the samples' dataset indices; undefined outside training
  int64_t step = 0;   // the optimizer step the micro-batch belongs to (1-based)
  uint64_t seed = 0;  // the run's seed
};

// One micro-batch as the data pipeline delivers it. Models read the fields they
// need: images use `input`/`target`; language models `input` (token ids),
// `target` (labels, -100 = ignored) and `attention_mask`.
struct Batch {
  torch::Tensor input;
  torch::Tensor target;
  torch::Tensor attention_mask;  // undefined when the task has no padding
  int64_t samples = 0;           // rows in this micro-batch
  SampleKeys keys;               // set by the engine for training micro-batches
};

// A loss as a sum over items and the number of items it covers (samples for
// classification, elements for MSE, non-ignored tokens for language models).
// Both are 0-dim tensors on the model's device, so nothing syncs with the host.
// The engine divides Σ sum by Σ count over a whole window (DESIGN.md §1).
struct LossSum {
  torch::Tensor sum;    // floating point, carries the autograd graph
  torch::Tensor count;  // int64
};

}  // namespace gradaccum::core
