// Detection of layers that couple the samples of a micro-batch.
//
// BatchNorm in training mode normalizes with the statistics of the micro-batch
// it sees, so b = 16 × N = 4 computes a different function from b = 64 and
// accumulation cannot equal the full batch (seed 000). GroupNorm and LayerNorm
// normalize each sample on its own and keep accumulation exact.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace gradaccum::core {

// Names (as in named_modules()) of BatchNorm layers that are in training mode.
std::vector<std::string> batch_dependent_layers(const torch::nn::Module& module);

// The start-up warning for those layers, or "" when there are none or when the
// run does not split the global batch (N == 1 and W == 1).
std::string batch_dependence_warning(const torch::nn::Module& module, int64_t accumulation_steps, int64_t world_size);

}  // namespace gradaccum::core
