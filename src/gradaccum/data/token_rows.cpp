#include "gradaccum/data/token_rows.h"

#include <algorithm>

#include "gradaccum/base/check.h"

namespace gradaccum::data {

void TokenRows::add(const TokenId* ids, int64_t n, const std::string& where) {
  offsets_.push_back(static_cast<int64_t>(stream_.size()));
  lengths_.push_back(n);
  for (int64_t k = 0; k < n; ++k) {
    GA_CHECK(ids[k] >= 0, "{}: token id {} at position {} is negative", where, ids[k], k);
    stream_.push_back(static_cast<int64_t>(ids[k]));
  }
}

torch::Tensor TokenRows::length_tensor() const { return torch::tensor(lengths_, torch::kLong); }

PaddedRows TokenRows::gather(const torch::Tensor& indices, TokenId pad_id, const std::string& what) const {
  GA_CHECK(indices.dim() == 1 && !indices.is_floating_point() && !indices.is_complex(),
           "{}: sample indices must be a 1-D integer tensor, got {}-D {}", what, indices.dim(),
           c10::toString(indices.scalar_type()));
  const auto idx = indices.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t* p = idx.data_ptr<int64_t>();
  const int64_t rows = idx.size(0);
  int64_t width = 0;
  for (int64_t r = 0; r < rows; ++r) {
    GA_CHECK(p[r] >= 0 && p[r] < size(), "{}: sample index {} out of range [0, {})", what, p[r], size());
    width = std::max(width, lengths_[p[r]]);
  }
  PaddedRows out;
  out.ids = torch::full({rows, width}, static_cast<int64_t>(pad_id), torch::kLong);
  out.mask = torch::zeros({rows, width}, torch::kLong);
  int64_t* ids = out.ids.data_ptr<int64_t>();
  int64_t* mask = out.mask.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = lengths_[p[r]];
    std::copy_n(stream_.data() + offsets_[p[r]], n, ids + r * width);
    std::fill_n(mask + r * width, n, int64_t{1});
  }
  return out;
}

}  // namespace gradaccum::data
