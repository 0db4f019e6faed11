#include "gradaccum/data/gather_rows.h"

#include <algorithm>
#include <cstring>

#include "gradaccum/base/check.h"

namespace gradaccum::data {

torch::Tensor gather_rows(const torch::Tensor& source, const torch::Tensor& indices) {
  const bool memcpy_path = source.device().is_cpu() && source.layout() == torch::kStrided && source.dim() >= 1 &&
                           source.is_contiguous() && indices.device().is_cpu() &&
                           indices.scalar_type() == torch::kLong && indices.dim() == 1 && indices.is_contiguous();
  if (!memcpy_path) return source.index_select(0, indices);
  auto sizes = source.sizes().vec();
  const int64_t rows = sizes[0];
  sizes[0] = indices.size(0);
  auto out = at::empty(sizes, source.options());
  const auto row_bytes = static_cast<size_t>(source.numel() / std::max<int64_t>(rows, 1)) * source.element_size();
  const auto* from = static_cast<const char*>(source.data_ptr());
  auto* to = static_cast<char*>(out.data_ptr());
  const auto* index = indices.data_ptr<int64_t>();
  for (int64_t i = 0; i < indices.size(0); ++i) {
    GA_CHECK(index[i] >= 0 && index[i] < rows, "sample index {} out of range [0, {})", index[i], rows);
    std::memcpy(to + static_cast<size_t>(i) * row_bytes, from + static_cast<size_t>(index[i]) * row_bytes, row_bytes);
  }
  return out;
}

}  // namespace gradaccum::data
