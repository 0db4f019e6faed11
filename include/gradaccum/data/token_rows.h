// Variable-length token sequences stored back to back, and the gathering of
// some of them into one right-padded [B, T] batch — the storage and collation
// shared by the text datasets.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gradaccum/data/byte_level_bpe.h"

namespace gradaccum::data {

struct PaddedRows {
  torch::Tensor ids;   // [B, T] int64, pad id after each row's end
  torch::Tensor mask;  // [B, T] int64, 1 on real tokens, 0 on padding
};

class TokenRows {
 public:
  // Appends a row of n ids; `where` names the row in the error on a negative id.
  void add(const TokenId* ids, int64_t n, const std::string& where);

  int64_t size() const { return static_cast<int64_t>(lengths_.size()); }
  const std::vector<int64_t>& lengths() const { return lengths_; }
  int64_t tokens() const { return static_cast<int64_t>(stream_.size()); }
  // lengths() as an int64 [size()] tensor (a copy).
  torch::Tensor length_tensor() const;

  // Rows `indices` (1-D integer tensor, any order, repeats allowed), T = the
  // longest of them (0 for no rows). An index outside [0, size()) throws
  // gradaccum::Error naming `what`.
  PaddedRows gather(const torch::Tensor& indices, TokenId pad_id, const std::string& what) const;

 private:
  std::vector<int64_t> stream_;
  std::vector<int64_t> offsets_;
  std::vector<int64_t> lengths_;
};

}  // namespace gradaccum::data
