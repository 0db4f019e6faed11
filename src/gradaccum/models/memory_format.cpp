#include "gradaccum/models/memory_format.h"

#include <array>

#include "gradaccum/base/check.h"

namespace gradaccum::models {

const base::EnumNames<MemoryFormat>& memory_format_names() {
  static const base::EnumNames<MemoryFormat> names{{MemoryFormat::automatic, "auto"},
                                                   {MemoryFormat::channels_last, "channels_last"},
                                                   {MemoryFormat::contiguous, "contiguous"}};
  return names;
}

std::string to_string(MemoryFormat format) { return memory_format_names().name(format); }

torch::Tensor MemoryFormatLayerImpl::forward(const torch::Tensor& x) {
  // One image at a time, ATen's convolution heuristics pick its im2col kernel for small inputs,
  // which has no channels-last path: the restride only adds copies there (0.94x of NCHW at the
  // CNN's 1x64, BENCHMARKS.md), so `auto` keeps a single-image micro-batch in NCHW.
  const bool channels_last = format_ == MemoryFormat::channels_last ||
                             (format_ == MemoryFormat::automatic && x.is_cpu() && x.dim() == 4 && x.size(0) > 1);
  if (!channels_last || x.dim() != 4) return x;
  const int64_t c = x.size(1), w = x.size(3);
  const auto wanted = std::array<int64_t, 4>{x.size(2) * w * c, 1, w * c, c};
  if (x.strides() == c10::IntArrayRef(wanted)) return x;
  return torch::empty_strided(x.sizes(), wanted, x.options()).copy_(x);
}

}  // namespace gradaccum::models
