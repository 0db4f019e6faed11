#include "gradaccum/kernels/masked_softmax.h"

#include <limits>

namespace gradaccum::kernels {

double lowest_finite(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kDouble:
      return std::numeric_limits<double>::lowest();
    case torch::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    case torch::kHalf:
      return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    default:
      return static_cast<double>(std::numeric_limits<float>::lowest());
  }
}

torch::Tensor masked_softmax(const torch::Tensor& scores, const torch::Tensor& allowed) {
  // 16-bit scores (from an autocast matmul) are normalized in float32, as CUDA
  // autocast does for softmax: float32's lowest does not fit in them, and a
  // 16-bit softmax over long rows loses the small probabilities.
  const bool low_precision = scores.scalar_type() == torch::kBFloat16 || scores.scalar_type() == torch::kHalf;
  const auto s = low_precision ? scores.to(torch::kFloat) : scores;
  return torch::softmax(s.masked_fill(allowed.logical_not(), lowest_finite(s.scalar_type())), -1);
}

}  // namespace gradaccum::kernels
