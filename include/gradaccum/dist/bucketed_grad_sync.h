// Deferred, bucketed, overlapped gradient synchronization: the narrow reducer
// this engine needs on c10d (libtorch has no DDP in C++).
//
// - Parameters are grouped into buckets of about `bucket_bytes`, in reverse
//   registration order (roughly the order backward produces them). Each
//   bucket is one flat buffer, and every parameter's .grad is a view into its
//   bucket (as DDP's gradient_as_bucket_view): the gradients are not held
//   twice, and a bucket is all-reduced where backward accumulated it, with no
//   copy in or out. Before each micro-step, a .grad that the step sequence set
//   to none is pointed back at its (zeroed) view; one that was replaced (a
//   restored partial window) is copied into it.
// - On a window's first N−1 micro-steps nothing is communicated: gradients
//   accumulate locally in .grad.
// - On the last micro-step, a post-hook on every parameter's gradient
//   accumulator notes when its gradient is final; a bucket whose gradients
//   are all final has its all-reduce (sum) launched at once, while backward
//   goes on computing the rest. Buckets are launched in index order on every
//   rank, so the collectives always match.
// - finish_window() launches what is left (parameters without a gradient,
//   ranks without samples), waits, and sums the window's loss totals. The
//   exact division by the global count is the LossNormalizer's job, done once
//   afterwards.
//
// `sync_each_micro_step` (for comparison only) all-reduces after every
// micro-step as DDP without no_sync() does; gradients are averaged each time
// and scaled back to a sum at the end, so the result stays exact.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <utility>
#include <vector>

#include "gradaccum/core/grad_sync.h"

namespace gradaccum::dist {

struct GradSyncOptions {
  int64_t bucket_bytes = 25 * 1024 * 1024;
  bool sync_each_micro_step = false;
};

class BucketedGradSync final : public core::GradSync {
 public:
  // Broadcasts rank 0's parameters so every rank starts identical.
  BucketedGradSync(c10::intrusive_ptr<c10d::Backend> group, std::vector<torch::Tensor> params, GradSyncOptions options);
  ~BucketedGradSync() override;

  int64_t world_size() const override { return group_->getSize(); }
  int64_t rank() const override { return group_->getRank(); }
  void before_backward(bool last) override;
  void after_backward(bool last) override;
  void finish_window(torch::Tensor& totals) override;
  int64_t allreduce_calls() const override { return calls_; }
  int64_t allreduce_bytes() const override { return bytes_; }

  int64_t buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    torch::Tensor buffer;        // flat, one dtype
    int64_t pending = 0;         // gradients not final yet in this round
    c10::intrusive_ptr<c10d::Work> work;
  };

  // Points parameter k's .grad at its view into the buckets, keeping its
  // value (zero when it had none); a no-op when it is the view already.
  void adopt_gradient(size_t k);
  // Whether parameter k's .grad is its bucket view.
  bool grad_is_view(size_t k) const;
  void on_gradient_ready(size_t param);
  void launch_ready_buckets(bool force);
  // Waits for every bucket, unpacks into .grad (scaled by `scale`), resets.
  void complete_round(double scale);

  c10::intrusive_ptr<c10d::Backend> group_;
  std::vector<torch::Tensor> params_;
  GradSyncOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;          // param index -> bucket index
  std::vector<torch::Tensor> grad_views_;  // param index -> its slice of its bucket, shaped like it
  std::vector<decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()))>
      accumulators_;             // keep hooks alive
  std::shared_ptr<bool> armed_;  // shared with the hooks
  size_t next_launch_ = 0;
  int64_t calls_ = 0, bytes_ = 0;
  int64_t window_calls_ = 0, window_bytes_ = 0;
};

}  // namespace gradaccum::dist
