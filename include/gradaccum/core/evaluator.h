// Evaluation over a whole dataset with exact normalization (Σ sums / Σ counts).
#pragma once

#include <torch/torch.h>

#include "gradaccum/core/mixed_precision.h"
#include "gradaccum/core/trainable.h"
#include "gradaccum/core/training_observer.h"

namespace gradaccum::core {

// Runs `model` in eval mode without autograd over `data` in order, `batch_size`
// samples at a time, and restores the previous training mode. The forward runs
// under `precision`'s autocast, as in training.
EvalRecord evaluate(Trainable& model, const Dataset& data, int64_t batch_size, torch::ScalarType dtype,
                    torch::Device device, MixedPrecision precision = MixedPrecision::none);

}  // namespace gradaccum::core
