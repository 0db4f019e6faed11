// Gathering some rows of an in-memory dataset into a micro-batch.
#pragma once

#include <torch/torch.h>

namespace gradaccum::data {

// source.index_select(0, indices): the rows `indices` of `source`, in that
// order, as a new contiguous tensor. On the CPU, for a contiguous source and
// int64 indices, it copies each row with memcpy: index_select costs about
// 10,000 instructions of set-up per call, which at micro-batch 1 is more than
// a small model's whole forward (bench/mlp_microstep). Anything else takes
// index_select. An index outside [0, rows) throws, naming it.
torch::Tensor gather_rows(const torch::Tensor& source, const torch::Tensor& indices);

}  // namespace gradaccum::data
