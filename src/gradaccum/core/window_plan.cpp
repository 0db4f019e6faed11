#include "gradaccum/core/window_plan.h"

#include <ATen/CPUGeneratorImpl.h>

#include "gradaccum/core/check.h"

namespace gradaccum::core {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

Window::Window(int64_t epoch, int64_t index, torch::Tensor samples, const BatchGeometry& geometry)
    : epoch_(epoch), index_(index), samples_(std::move(samples)), geometry_(geometry) {
  const int64_t chunks = ceil_div(size(), geometry_.micro_batch());
  micro_steps_ = ceil_div(chunks, geometry_.world_size());
}

torch::Tensor Window::micro_batch(int64_t step, int64_t rank) const {
  GA_CHECK(step >= 0 && step < micro_steps_, "micro-step {} out of range [0, {})", step,
           micro_steps_);
  GA_CHECK(rank >= 0 && rank < geometry_.world_size(), "rank {} out of range [0, {})", rank,
           geometry_.world_size());
  const int64_t b = geometry_.micro_batch();
  const int64_t chunk = step * geometry_.world_size() + rank;
  const int64_t begin = std::min(chunk * b, size());
  const int64_t end = std::min(begin + b, size());
  return samples_.slice(0, begin, end);
}

int64_t Window::samples_of_rank(int64_t rank) const {
  int64_t total = 0;
  for (int64_t s = 0; s < micro_steps_; ++s) total += micro_batch(s, rank).size(0);
  return total;
}

WindowPlan::WindowPlan(int64_t dataset_size, BatchGeometry geometry, LastWindow last_window,
                       uint64_t seed, SampleOrder order)
    : dataset_size_(dataset_size),
      geometry_(geometry),
      last_window_(last_window),
      seed_(seed),
      order_(order) {
  GA_CHECK(dataset_size > 0, "the training dataset is empty");
  GA_CHECK(windows_per_epoch() > 0,
           "the training dataset has {} samples, fewer than one global batch of {} with "
           "last_window: drop",
           dataset_size, geometry_.global_batch());
}

int64_t WindowPlan::windows_per_epoch() const {
  const int64_t full = dataset_size_ / geometry_.global_batch();
  const bool remainder = dataset_size_ % geometry_.global_batch() != 0;
  return full + (remainder && last_window_ == LastWindow::partial ? 1 : 0);
}

uint64_t WindowPlan::epoch_seed(uint64_t seed, int64_t epoch) {
  // splitmix64 finalizer: decorrelates neighbouring (seed, epoch) pairs.
  uint64_t z = seed + static_cast<uint64_t>(epoch + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

torch::Tensor WindowPlan::permutation(int64_t epoch) const {
  if (order_ == SampleOrder::sequential) return torch::arange(dataset_size_, torch::kLong);
  auto generator = at::detail::createCPUGenerator(epoch_seed(seed_, epoch));
  return torch::randperm(dataset_size_, generator, torch::TensorOptions().dtype(torch::kLong));
}

Window WindowPlan::window(const torch::Tensor& permutation, int64_t epoch, int64_t k) const {
  GA_CHECK(k >= 0 && k < windows_per_epoch(), "window {} out of range [0, {})", k,
           windows_per_epoch());
  const int64_t begin = k * geometry_.global_batch();
  const int64_t end = std::min(begin + geometry_.global_batch(), dataset_size_);
  auto samples = permutation.slice(0, begin, end);
  if (lengths_.defined()) {
    // Longest first, ties in permutation order: micro-batches of similar
    // lengths waste less padding, and the window's set is unchanged.
    const auto order = std::get<1>(lengths_.index_select(0, samples).sort(/*stable=*/true, 0, /*descending=*/true));
    samples = samples.index_select(0, order);
  }
  return Window(epoch, k, samples, geometry_);
}

void WindowPlan::group_by_length(torch::Tensor lengths) {
  GA_CHECK(lengths.dim() == 1 && lengths.size(0) == dataset_size_,
           "group_by_length: {} lengths for {} samples", lengths.numel(), dataset_size_);
  lengths_ = lengths.to(torch::kLong).contiguous();
}

}  // namespace gradaccum::core
