// ZeRO stage 2: each data-parallel rank keeps the window's summed gradient for its own shard only.
//
// The shards are ZeRO-1's (sharded_optimizer.h): the parameters flattened in order and cut into
// W equal ranges, the last one padded; rank r keeps range r's summed gradient in one flat
// accumulator of the parameters' dtype (float32, or float64 in a float64 run), and its
// ShardedOptimizer steps that range from it, then all-gathers the parameters. After
// finish_window the parameters have no .grad: normalization and clipping act on the shard
// (gradients()), and the global norm is one all-reduce of the squared shard norms.
//
// How the micro-steps' gradients reach the shard is the policy (grad_shard_policy.h):
// - defer: autograd accumulates the whole gradient in .grad as without sharding; finish_window
//   reduce-scatters it once (one collective per chunk per window, none before the last
//   micro-step) and releases it.
// - each_micro_step: after every micro-step's backward (also on a rank that ran none: the
//   collectives must match), .grad is reduce-scattered, added into the shard and released:
//   N collectives per chunk per window. Backward still makes the whole of one micro-step's
//   .grad; between micro-steps only the shard is held. Its partial sums live in the shard, not
//   in .grad, so a stop requested inside a window waits for the window's end.
//
// A reduce-scatter takes `bucket_bytes` of input at most: W pieces of one chunk of the ranges,
// rank r's piece being the chunk's elements of range r, staged into one buffer from the
// parameters' .grad (zeros where a parameter has none). The reduce-scatters run after backward,
// not overlapped with it. This libtorch's Gloo backend implements reduce_scatter_single for CPU
// tensors, and it is what runs here (NCCL's on a GPU). Over loopback on a busy 2-core machine it
// measured no faster than Gloo's all-reduce of the same 64 MB float32 input at W = 2 (260–480 ms
// against 95–370 ms; a Python ring of isend/irecv, which sends half an all-reduce's bytes, took
// 260–420 ms), so a ring of point-to-point sends is not built yet.
#pragma once

#include <torch/torch.h>

#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "gradaccum/core/grad_sync.h"
#include "gradaccum/dist/grad_shard_policy.h"

namespace gradaccum::dist {

struct ShardedGradSyncOptions {
  // each_micro_step or defer; ZeRO-2 needs auto chosen before, ZeRO-3 chooses it per unit from
  // `available_bytes` (choose_unit_grad_shard_policies).
  GradShardPolicy policy = GradShardPolicy::defer;
  int64_t bucket_bytes = 25 * 1024 * 1024;  // input bytes of one reduce-scatter at most
  int64_t available_bytes = 0;              // the least memory any rank has available (ZeRO-3's auto)
};

class ShardedGradSync final : public core::GradSync {
 public:
  // `params` in the same order on every rank, all of one dtype and device. Broadcasts rank 0's
  // parameters so every rank starts identical.
  ShardedGradSync(c10::intrusive_ptr<c10d::Backend> group, std::vector<torch::Tensor> params,
                  ShardedGradSyncOptions options);

  int64_t world_size() const override { return group_->getSize(); }
  int64_t rank() const override { return group_->getRank(); }
  void before_backward(bool last) override;
  void after_backward(bool last) override;
  void finish_window(torch::Tensor& totals) override;
  int64_t allreduce_calls() const override { return calls_; }  // reduce-scatters
  int64_t allreduce_bytes() const override { return bytes_; }  // their input bytes on this rank
  std::vector<torch::Tensor> gradients(const std::vector<torch::Tensor>& params) const override;
  torch::Tensor global_norm(const std::vector<torch::Tensor>& gradients) override;
  bool can_stop_inside_window() const override { return options_.policy == GradShardPolicy::defer; }
  std::string sharded_policy() const override { return grad_shard_policy_names().name(options_.policy); }

  // This rank's range of the flattened parameters, [begin, end), and the padded range size.
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t shard_size() const { return shard_size_; }
  // The window's summed gradient over this rank's range (end − begin elements, flat), from
  // finish_window to the next window's first micro-step: what the ShardedOptimizer steps.
  torch::Tensor gradient_shard() const;
  // Reduce-scatters of the window in flight so far.
  int64_t window_reduce_scatters() const { return window_calls_; }
  // Reduce-scatters per reduction (chunks of the ranges).
  int64_t chunks() const { return (shard_size_ + chunk_ - 1) / chunk_; }
  // Gradient bytes this rank holds now, counted from the tensors: every parameter's .grad (each
  // storage once) and the shard.
  int64_t held_gradient_bytes() const;

 private:
  // Sums every parameter's .grad over the ranks into the shard (added to what it holds) and
  // releases .grad.
  void reduce_into_shard();
  // Copies flattened elements [lo, hi) of the parameters' .grad into `piece` (zeros past the end
  // and where a parameter has no gradient).
  void stage(torch::Tensor piece, int64_t lo, int64_t hi) const;

  c10::intrusive_ptr<c10d::Backend> group_;
  std::vector<torch::Tensor> params_;
  ShardedGradSyncOptions options_;
  std::vector<int64_t> offsets_;  // where each parameter starts in the flattened parameters
  int64_t shard_size_ = 0;        // elements per rank (the last range is padded)
  int64_t begin_ = 0, end_ = 0;
  int64_t chunk_ = 1;       // elements of a range per reduce-scatter
  torch::Tensor shard_;     // shard_size_ elements; undefined until the window's first reduction
  bool in_window_ = false;  // between a window's first micro-step and its finish_window
  int64_t calls_ = 0, bytes_ = 0;
  int64_t window_calls_ = 0, window_bytes_ = 0;
};

}  // namespace gradaccum::dist
