// deterministic_accumulation's reduction across ranks: the top log2(W) levels of the canonical
// tree (core/canonical_sum.h). Each rank arrives with its subtree's root (its N slots' gradients
// in tree order); at level k it exchanges its partial sum with rank r xor 2^k and adds, so after
// log2(W) exchanges every rank holds the same bits: the pairs are the tree's, and IEEE addition is
// commutative. A ring all-reduce (Gloo's, NCCL's) adds in an order that depends on W and on
// chunk boundaries; this one depends on nothing but the tree.
//
// Cost: log2(W) exchanges of the whole gradient in each direction (a ring all-reduce sends about
// 2 × the gradient in total, so this sends log2(W) / 2 times as much; the same for W = 2), and
// one gradient-sized receive buffer. Nothing overlaps backward: everything happens in
// finish_window. Gradients a rank lacks (a parameter without a gradient, a rank without samples
// in a partial window) are absent, not zero, so they add nothing (canonical_sum.h).
#pragma once

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "gradaccum/core/grad_sync.h"

namespace gradaccum::dist {

class TreeGradSync final : public core::GradSync {
 public:
  // Broadcasts rank 0's parameters so every rank starts identical. Throws gradaccum::Error when
  // the world size is not a power of two or the parameters have more than one dtype.
  TreeGradSync(c10::intrusive_ptr<c10d::Backend> group, std::vector<torch::Tensor> params);

  int64_t world_size() const override { return group_->getSize(); }
  int64_t rank() const override { return group_->getRank(); }
  void before_backward(bool) override {}
  // Reduces the gradients and `totals` (summed: the engine's totals are exact sums, and the
  // loss's own sum is recomputed from its slots in tree order) over the ranks.
  void finish_window(torch::Tensor& totals) override;
  int64_t allreduce_calls() const override { return calls_; }  // exchanges, each way
  int64_t allreduce_bytes() const override { return bytes_; }  // bytes this rank sent

 private:
  // Sends `mine` to `partner` and receives its tensor into `theirs`, the lower rank sending
  // first (so that NCCL's point-to-point calls pair up instead of both ranks waiting to send).
  void exchange(torch::Tensor& mine, torch::Tensor& theirs, int partner, int tag, const char* what);

  c10::intrusive_ptr<c10d::Backend> group_;
  std::vector<torch::Tensor> params_;
  int64_t calls_ = 0, bytes_ = 0;
};

}  // namespace gradaccum::dist
