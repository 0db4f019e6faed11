// The memory layout an image network computes in: model.memory_format.
//
// libtorch's CPU convolutions (oneDNN), max-pooling and GroupNorm all have channels-last kernels,
// and on the default CNN at micro-batches of 4 to 64 a step in that layout takes 0.75–0.9 of the
// time it takes in the default [N, C, H, W] layout (BENCHMARKS.md); the plain NCHW max-pool kernel
// alone is a tenth of an optimizer step there. Only the activations change layout: the network's
// first layer restrides its input batch, and every later layer keeps the layout of its input.
// Parameters, gradients, optimizer state and checkpoints stay in the default layout, so nothing
// outside the network sees a difference.
#pragma once

#include <torch/torch.h>

#include <string>

#include "gradaccum/base/enum_names.h"

namespace gradaccum::models {

enum class MemoryFormat {
  automatic,      // channels_last for CPU micro-batches of 2 or more images (measured there), else contiguous
  channels_last,  // [N, C, H, W] stored as N, H, W, C
  contiguous,     // libtorch's default layout
};
// "auto" | "channels_last" | "contiguous" (model.memory_format).
const base::EnumNames<MemoryFormat>& memory_format_names();
std::string to_string(MemoryFormat format);

// The first layer of an image network: returns a 4-d batch in `format`'s layout, anything else
// unchanged. A [N, 1, H, W] batch is already channels-last contiguous by libtorch's rule, which
// would leave the first convolution choosing the default layout, so the strides are set
// explicitly (N·H·W·C order) rather than through Tensor::contiguous.
class MemoryFormatLayerImpl : public torch::nn::Cloneable<MemoryFormatLayerImpl> {
 public:
  explicit MemoryFormatLayerImpl(MemoryFormat format = MemoryFormat::automatic) : format_(format) {}
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x);
  MemoryFormat format() const { return format_; }

 private:
  MemoryFormat format_;
};
TORCH_MODULE(MemoryFormatLayer);

}  // namespace gradaccum::models
