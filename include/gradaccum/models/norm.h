// Normalization layers selectable by name: batch | group | layer | none.
// Only `batch` couples the samples of a micro-batch (see core/batch_dependence.h).
#pragma once

#include <torch/torch.h>

#include <string>

#include "gradaccum/base/enum_names.h"

namespace gradaccum::models {

enum class NormKind { batch, group, layer, none };

// "batch" | "group" | "layer" | "none" (model.norm).
const base::EnumNames<NormKind>& norm_kind_names();
std::string to_string(NormKind kind);

// For [n, channels, h, w] activations. group: GroupNorm with `groups` groups
// (reduced to a divisor of `channels`); layer: GroupNorm with one group, i.e.
// LayerNorm over (C, H, W) of each sample.
torch::nn::AnyModule make_norm2d(NormKind kind, int64_t channels, int64_t groups);
// For [n, features] activations.
torch::nn::AnyModule make_norm1d(NormKind kind, int64_t features, int64_t groups);

}  // namespace gradaccum::models
