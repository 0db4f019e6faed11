// Which samples feed which optimizer step, micro-step and rank.
//
// Each epoch draws a seeded permutation of the dataset that depends only on
// (seed, epoch, dataset size) — never on b, N or W — and window k is
// permutation[kB, (k+1)B). So the *set* of samples behind every optimizer step
// is the same for every decomposition of B, which is what makes the results
// comparable (DESIGN.md §1).
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "gradaccum/core/batch_geometry.h"

namespace gradaccum::core {

enum class LastWindow { partial, drop };

// The order of the samples in each epoch (HF's train_sampling_strategy):
// a seeded permutation, or the dataset's own order (to replay a fixed
// sequence of batches, e.g. against another trainer reading the same file).
enum class SampleOrder { random, sequential };

// The samples of one window and how they are cut into micro-batches.
// The window's samples are cut into chunks of b in order; chunk c goes to rank
// c % W at micro-step c / W. A partial window therefore has fewer micro-steps,
// its last chunk may be short, and a rank may get an empty micro-batch.
class Window {
 public:
  Window(int64_t epoch, int64_t index, torch::Tensor samples, const BatchGeometry& geometry);

  int64_t epoch() const { return epoch_; }
  int64_t index() const { return index_; }  // k within the epoch
  int64_t size() const { return samples_.size(0); }  // samples over all ranks
  bool is_partial() const { return size() < geometry_.global_batch(); }
  // Micro-steps every rank runs in this window (N, or fewer in a partial window).
  int64_t micro_steps() const { return micro_steps_; }
  // Sample indices of rank `rank` at micro-step `step` (possibly empty).
  torch::Tensor micro_batch(int64_t step, int64_t rank = 0) const;
  // Samples rank `rank` sees in the whole window.
  int64_t samples_of_rank(int64_t rank) const;
  const torch::Tensor& samples() const { return samples_; }

 private:
  int64_t epoch_;
  int64_t index_;
  torch::Tensor samples_;  // int64, all ranks
  BatchGeometry geometry_;
  int64_t micro_steps_;
};

class WindowPlan {
 public:
  WindowPlan(int64_t dataset_size, BatchGeometry geometry, LastWindow last_window, uint64_t seed,
             SampleOrder order = SampleOrder::random);

  const BatchGeometry& geometry() const { return geometry_; }
  int64_t dataset_size() const { return dataset_size_; }
  // Optimizer steps per epoch: floor(n / B), plus one for a partial remainder.
  int64_t windows_per_epoch() const;
  // The permutation of epoch `epoch`: a pure function of (seed, epoch, n);
  // 0, 1, …, n-1 in every epoch with SampleOrder::sequential.
  torch::Tensor permutation(int64_t epoch) const;
  // Window k of an epoch whose permutation is given (to draw it once per epoch).
  Window window(const torch::Tensor& permutation, int64_t epoch, int64_t k) const;

  // The seed of epoch e's permutation generator. Documented so that other
  // programs (the Python peer benchmark) can reproduce the order:
  // splitmix64(seed + (epoch + 1) * 0x9E3779B97F4A7C15).
  static uint64_t epoch_seed(uint64_t seed, int64_t epoch);

  // Length-grouped batching: each window's samples are sorted by `lengths`
  // (one per sample), longest first, before they are cut into micro-batches.
  // Only the order inside a window changes, never which samples form it, so
  // accumulation stays exact; it differs from HF's group_by_length, which
  // sorts across mega-batches and so changes the windows themselves.
  void group_by_length(torch::Tensor lengths);

 private:
  int64_t dataset_size_;
  BatchGeometry geometry_;
  LastWindow last_window_;
  uint64_t seed_;
  SampleOrder order_;
  torch::Tensor lengths_;  // undefined: no grouping
};

}  // namespace gradaccum::core
