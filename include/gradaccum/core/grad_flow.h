// Gradient flow (seed 002's chart): for every parameter tensor, the mean and the largest |g| of
// the window's final gradient — normalized by the window's global count, before clipping, the
// gradient the optimizer is about to use — and its fraction of exact zeros. The statistics are
// reductions on the gradients' device; the Trainer reads them with the step's own transfer.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gradaccum/core/training_observer.h"  // GradFlowRecord

namespace gradaccum::core {

// [P, 3] float64 on the gradients' device: mean |g|, max |g| and the fraction of zeros of each
// parameter's .grad (0, 0, 1 for a parameter without one). No host read.
torch::Tensor grad_flow_statistics(const std::vector<torch::Tensor>& params);

// The record of `statistics` (grad_flow_statistics, on the CPU).
GradFlowRecord grad_flow_record(int64_t step, const std::vector<std::string>& names, const torch::Tensor& statistics);

}  // namespace gradaccum::core
