// Which samples feed which optimizer step, micro-step and rank.
//
// Each epoch draws a seeded permutation of the dataset that depends only on
// (seed, epoch, dataset size) — never on b, N or W — and window k is
// permutation[kB, (k+1)B). So the *set* of samples behind every optimizer step
// is the same for every decomposition of B, which is what makes the results
// comparable (DESIGN.md §1).
//
// With a token count T (WindowPlan::set_window_tokens) windows are measured in tokens instead:
// a window closes at the first sample boundary, in the permutation's order, where its samples'
// items (a language model's non-ignored targets) reach T. The boundaries depend on (seed, epoch,
// the samples' items, T) only, so again every b and W cut the same windows.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "gradaccum/base/enum_names.h"
#include "gradaccum/core/batch_geometry.h"

namespace gradaccum::core {

// What happens to the samples left over at an epoch's end (n not a multiple of B):
//   partial: one shorter window, normalized by its own count
//   drop:    they are skipped this epoch
//   carry:   they open the next epoch's first window, so every window holds B samples and none is
//            lost. Windows are then consecutive slices of B of the stream perm(0) ++ perm(1) ++ …
//            (each epoch's permutation drawn as always), numbered across epochs; a window that
//            straddles an epoch boundary takes the tail of one permutation and the head of the
//            next, so it may hold a sample twice (once from each epoch) while every epoch still
//            uses each sample exactly once. Only the run's very last window can be short.
enum class LastWindow { partial, drop, carry };
const base::EnumNames<LastWindow>& last_window_names();  // "partial" | "drop" | "carry"

// The order of the samples in each epoch (HF's train_sampling_strategy):
// a seeded permutation, or the dataset's own order (to replay a fixed
// sequence of batches, e.g. against another trainer reading the same file).
// longest_first: the samples by length, longest first, in every epoch (ties in stored order):
// the first windows are the worst case for memory, which is what `gradaccum plan` probes.
enum class SampleOrder { random, sequential, longest_first };
// HF's spelling: "random" | "sequential" | "longest_first".
const base::EnumNames<SampleOrder>& sample_order_names();

// Which rank and micro-step get chunk c of a window (the window's samples cut into chunks of b).
enum class ChunkOrder {
  interleaved,  // rank c % W at micro-step c / W: every rank's micro-step s holds neighbouring chunks
  contiguous,   // rank c / N at micro-step c % N: each rank holds a run of N chunks, the order
                // deterministic accumulation's canonical tree needs (canonical_sum.h)
};

// The samples of one window and how they are cut into micro-batches.
// The window's samples are cut into chunks of b in order, which go to ranks and micro-steps in
// the ChunkOrder. A partial window therefore has fewer micro-steps (interleaved) or fewer
// chunks on its later ranks (contiguous), its last chunk may be short, and a rank may get an
// empty micro-batch.
//
// With a token budget K (WindowPlan::set_token_budget) the chunks are cut by tokens instead of
// rows: in order, each chunk takes samples while its padded size (rows × its longest sample, the
// dynamic padding of the language-model batches) stays within K; a sample longer than K is a chunk
// of its own. Chunks go to ranks interleaved, so N varies from window to window; b is unused.
class Window {
 public:
  Window(int64_t epoch, int64_t index, torch::Tensor samples, const BatchGeometry& geometry,
         ChunkOrder order = ChunkOrder::interleaved);
  // Cut by a token budget: `lengths` holds every dataset sample's length.
  Window(int64_t epoch, int64_t index, torch::Tensor samples, const BatchGeometry& geometry, int64_t token_budget,
         const torch::Tensor& lengths);

  int64_t epoch() const { return epoch_; }
  int64_t index() const { return index_; }           // k within the epoch
  int64_t size() const { return samples_.size(0); }  // samples over all ranks
  bool is_partial() const { return size() < geometry_.global_batch(); }
  // Micro-steps every rank runs in this window (N, or fewer in a partial window).
  int64_t micro_steps() const { return micro_steps_; }
  // The window's micro-batch slot (rank × N + micro-step, in [0, N × W)) of rank `rank`'s
  // micro-step `step` under the contiguous order.
  int64_t slot(int64_t step, int64_t rank) const { return rank * geometry_.accumulation_steps() + step; }
  ChunkOrder chunk_order() const { return order_; }
  // Tokens of the window's micro-batches as padded (rows × each chunk's longest sample) and as
  // the samples hold them; 0 when the samples have no length.
  int64_t padded_tokens() const { return padded_tokens_; }
  int64_t sample_tokens() const { return sample_tokens_; }
  void set_padding(int64_t padded_tokens, int64_t sample_tokens) {
    padded_tokens_ = padded_tokens;
    sample_tokens_ = sample_tokens;
  }
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
  ChunkOrder order_;
  int64_t micro_steps_;
  std::vector<int64_t> chunk_starts_;  // token budget: chunk c is [starts[c], starts[c + 1]); else empty
  int64_t padded_tokens_ = 0, sample_tokens_ = 0;
};

class WindowPlan {
 public:
  WindowPlan(int64_t dataset_size, BatchGeometry geometry, LastWindow last_window, uint64_t seed,
             SampleOrder order = SampleOrder::random);

  const BatchGeometry& geometry() const { return geometry_; }
  int64_t dataset_size() const { return dataset_size_; }
  bool carries() const { return last_window_ == LastWindow::carry; }
  // Optimizer steps per epoch: floor(n / B), plus one for a partial remainder (carry: n / B
  // rounded down, for display; windows are counted across epochs, windows_in_epochs()).
  // Token windows: epoch 0's count (windows_in_epoch() gives each epoch's).
  int64_t windows_per_epoch() const;
  // Optimizer steps in epoch `epoch` (the same for every epoch unless windows are measured in
  // tokens: then each epoch's permutation closes its own number of windows).
  int64_t windows_in_epoch(int64_t epoch) const;
  // Optimizer steps in `epochs` epochs: the sum of windows_in_epoch(), or with carry
  // ceil(epochs × n / B).
  int64_t windows_in_epochs(int64_t epochs) const;
  // The permutation of epoch `epoch`: a pure function of (seed, epoch, n);
  // 0, 1, …, n-1 in every epoch with SampleOrder::sequential.
  torch::Tensor permutation(int64_t epoch) const;
  // Window k of an epoch whose permutation is given (to draw it once per epoch).
  Window window(const torch::Tensor& permutation, int64_t epoch, int64_t k) const;
  // carry: window g of the stream (counted from the run's start), which ends after `epochs`
  // epochs (0: never, a run bounded by max_steps). Its epoch() is the epoch of its first sample.
  // The last two epochs' permutations are kept between calls.
  Window carried_window(int64_t g, int64_t epochs) const;
  // carry: the epoch in which window g starts.
  int64_t epoch_of_carried_window(int64_t g) const;

  // The seed of epoch e's permutation generator. Documented so that other
  // programs (the Python peer benchmark) can reproduce the order:
  // splitmix64(seed + (epoch + 1) * 0x9E3779B97F4A7C15).
  static uint64_t epoch_seed(uint64_t seed, int64_t epoch);

  // Length-grouped batching: each window's samples are sorted by `lengths`
  // (one per sample), longest first, before they are cut into micro-batches.
  // Only the order inside a window changes, never which samples form it, so
  // accumulation stays exact; it differs from HF's group_by_length, which
  // sorts across mega-batches and so changes the windows themselves.
  // (Sets the plan's lengths, as set_lengths.)
  void group_by_length(torch::Tensor lengths);
  // Another decomposition of the same global batch (out-of-memory recovery): later windows are
  // cut into its micro-batches; which samples form a window does not change.
  void set_geometry(const BatchGeometry& geometry);
  // Each sample's length (int64 [n]), when the samples have one: every window then reports its
  // padding, and SampleOrder::longest_first, grouping and token budgets use them.
  void set_lengths(torch::Tensor lengths);
  // max_tokens_per_micro_batch: windows are cut into chunks of at most `tokens` padded tokens
  // (Window), by the lengths of set_lengths. 0 turns it off.
  void set_token_budget(int64_t tokens);
  // window_tokens: each window closes at the first sample boundary where the Σ of `items` (one
  // count per sample, Dataset::sample_items) of its samples reaches `tokens`; the epoch's last
  // window holds the rest (fewer tokens; skipped with LastWindow::drop). Each window is cut into
  // chunks of b samples (or by the token budget), interleaved over the ranks, so N varies from
  // window to window and the geometry's N is unused. 0 turns it off. Not with carry or the
  // contiguous chunk order.
  void set_window_tokens(int64_t tokens, torch::Tensor items);
  int64_t window_tokens() const { return window_tokens_; }
  // How windows hand their chunks to ranks and micro-steps (default interleaved).
  void set_chunk_order(ChunkOrder order) { chunk_order_ = order; }

 private:
  int64_t dataset_size_;
  BatchGeometry geometry_;
  LastWindow last_window_;
  uint64_t seed_;
  SampleOrder order_;
  // The window of `samples` (sorted by length when grouping), numbered `index`.
  Window make_window(int64_t epoch, int64_t index, torch::Tensor samples) const;
  const torch::Tensor& cached_permutation(int64_t epoch) const;

  torch::Tensor lengths_;  // every sample's length; undefined: samples without one
  bool grouped_ = false;   // group_by_length
  int64_t token_budget_ = 0;
  ChunkOrder chunk_order_ = ChunkOrder::interleaved;
  mutable std::vector<std::pair<int64_t, torch::Tensor>> permutations_;  // carry: the last two

  int64_t window_tokens_ = 0;
  std::vector<int64_t> items_;  // window_tokens: every sample's items
  // window_tokens: where epoch `epoch`'s windows begin in its permutation, then the end of the
  // last one; cached for the epoch asked last.
  const std::vector<int64_t>& window_starts(int64_t epoch, const torch::Tensor& permutation) const;
  mutable int64_t starts_epoch_ = -1;
  mutable std::vector<int64_t> starts_;
};

}  // namespace gradaccum::core
