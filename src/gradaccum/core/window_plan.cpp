#include "gradaccum/core/window_plan.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <numeric>

#include "gradaccum/base/check.h"

namespace gradaccum::core {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

Window::Window(int64_t epoch, int64_t index, torch::Tensor samples, const BatchGeometry& geometry, ChunkOrder order)
    : epoch_(epoch), index_(index), samples_(std::move(samples)), geometry_(geometry), order_(order) {
  const int64_t chunks = ceil_div(size(), geometry_.micro_batch());
  // Contiguous: rank 0 holds the first min(N, chunks) chunks, the most of any rank.
  micro_steps_ = order_ == ChunkOrder::interleaved ? ceil_div(chunks, geometry_.world_size())
                                                   : std::min(chunks, geometry_.accumulation_steps());
}

namespace {
// Rows × longest over consecutive chunks of b (the padding of the plain cut).
int64_t padded_in_chunks_of(const std::vector<int64_t>& lengths, int64_t b) {
  int64_t padded = 0;
  for (size_t begin = 0; begin < lengths.size(); begin += static_cast<size_t>(b)) {
    const size_t end = std::min(lengths.size(), begin + static_cast<size_t>(b));
    padded += static_cast<int64_t>(end - begin) * *std::max_element(lengths.begin() + begin, lengths.begin() + end);
  }
  return padded;
}

std::vector<int64_t> lengths_of(const torch::Tensor& samples, const torch::Tensor& lengths) {
  const auto picked = lengths.index_select(0, samples).contiguous();
  return {picked.data_ptr<int64_t>(), picked.data_ptr<int64_t>() + picked.numel()};
}
}  // namespace

Window::Window(int64_t epoch, int64_t index, torch::Tensor samples, const BatchGeometry& geometry, int64_t token_budget,
               const torch::Tensor& lengths)
    : epoch_(epoch), index_(index), samples_(std::move(samples)), geometry_(geometry), order_(ChunkOrder::interleaved) {
  GA_CHECK(token_budget > 0, "token budget {} is not positive", token_budget);
  const auto l = lengths_of(samples_, lengths);
  chunk_starts_.push_back(0);
  int64_t longest = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    const int64_t rows = static_cast<int64_t>(i) - chunk_starts_.back();
    const int64_t with = std::max(longest, l[i]);
    if (rows > 0 && (rows + 1) * with > token_budget) {  // close the chunk before sample i
      padded_tokens_ += rows * longest;
      chunk_starts_.push_back(static_cast<int64_t>(i));
      longest = l[i];
    } else {
      longest = with;
    }
    sample_tokens_ += l[i];
  }
  padded_tokens_ += (static_cast<int64_t>(l.size()) - chunk_starts_.back()) * longest;
  chunk_starts_.push_back(static_cast<int64_t>(l.size()));
  micro_steps_ = ceil_div(static_cast<int64_t>(chunk_starts_.size()) - 1, geometry_.world_size());
}

torch::Tensor Window::micro_batch(int64_t step, int64_t rank) const {
  GA_CHECK(step >= 0 && step < micro_steps_, "micro-step {} out of range [0, {})", step, micro_steps_);
  GA_CHECK(rank >= 0 && rank < geometry_.world_size(), "rank {} out of range [0, {})", rank, geometry_.world_size());
  const int64_t b = geometry_.micro_batch();
  const int64_t chunk = order_ == ChunkOrder::interleaved ? step * geometry_.world_size() + rank : slot(step, rank);
  if (!chunk_starts_.empty()) {
    const int64_t chunks = static_cast<int64_t>(chunk_starts_.size()) - 1;
    if (chunk >= chunks) return samples_.slice(0, size(), size());  // this rank idles
    return samples_.slice(0, chunk_starts_[static_cast<size_t>(chunk)], chunk_starts_[static_cast<size_t>(chunk) + 1]);
  }
  const int64_t begin = std::min(chunk * b, size());
  const int64_t end = std::min(begin + b, size());
  return samples_.slice(0, begin, end);
}

int64_t Window::samples_of_rank(int64_t rank) const {
  int64_t total = 0;
  for (int64_t s = 0; s < micro_steps_; ++s) total += micro_batch(s, rank).size(0);
  return total;
}

WindowPlan::WindowPlan(int64_t dataset_size, BatchGeometry geometry, LastWindow last_window, uint64_t seed,
                       SampleOrder order)
    : dataset_size_(dataset_size), geometry_(geometry), last_window_(last_window), seed_(seed), order_(order) {
  GA_CHECK(dataset_size > 0, "the training dataset is empty");
  GA_CHECK(windows_per_epoch() > 0,
           "the training dataset has {} samples, fewer than one global batch of {} with "
           "last_window: drop",
           dataset_size, geometry_.global_batch());
}

int64_t WindowPlan::windows_per_epoch() const {
  if (window_tokens_ > 0) return windows_in_epoch(0);
  const int64_t full = dataset_size_ / geometry_.global_batch();
  if (carries()) return std::max<int64_t>(full, 1);
  const bool remainder = dataset_size_ % geometry_.global_batch() != 0;
  return full + (remainder && last_window_ == LastWindow::partial ? 1 : 0);
}

int64_t WindowPlan::windows_in_epoch(int64_t epoch) const {
  if (window_tokens_ == 0) return windows_per_epoch();
  const auto& starts = starts_epoch_ == epoch ? starts_ : window_starts(epoch, permutation(epoch));
  return static_cast<int64_t>(starts.size()) - 1;
}

int64_t WindowPlan::windows_in_epochs(int64_t epochs) const {
  if (carries()) return ceil_div(epochs * dataset_size_, geometry_.global_batch());
  if (window_tokens_ == 0) return epochs * windows_per_epoch();
  int64_t windows = 0;
  for (int64_t e = 0; e < epochs; ++e) windows += windows_in_epoch(e);
  return windows;
}

const std::vector<int64_t>& WindowPlan::window_starts(int64_t epoch, const torch::Tensor& permutation) const {
  if (starts_epoch_ == epoch) return starts_;
  const auto order = permutation.contiguous();
  const int64_t* sample = order.data_ptr<int64_t>();
  starts_.assign(1, 0);
  int64_t items = 0;
  for (int64_t i = 0; i < dataset_size_; ++i) {
    items += items_[static_cast<size_t>(sample[i])];
    if (items >= window_tokens_) {
      starts_.push_back(i + 1);
      items = 0;
    }
  }
  if (starts_.back() < dataset_size_ && last_window_ == LastWindow::partial) starts_.push_back(dataset_size_);
  starts_epoch_ = epoch;
  return starts_;
}

uint64_t WindowPlan::epoch_seed(uint64_t seed, int64_t epoch) {
  // splitmix64 finalizer: decorrelates neighbouring (seed, epoch) pairs.
  uint64_t z = seed + static_cast<uint64_t>(epoch + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

torch::Tensor WindowPlan::permutation(int64_t epoch) const {
  // longest_first without lengths (images): the samples are all alike, the stored order is as bad as any.
  if (order_ == SampleOrder::sequential || (order_ == SampleOrder::longest_first && !lengths_.defined())) {
    return torch::arange(dataset_size_, torch::kLong);
  }
  if (order_ == SampleOrder::longest_first) {
    return std::get<1>(lengths_.sort(/*stable=*/true, 0, /*descending=*/true));
  }
  auto generator = at::detail::createCPUGenerator(epoch_seed(seed_, epoch));
  return torch::randperm(dataset_size_, generator, torch::TensorOptions().dtype(torch::kLong));
}

Window WindowPlan::window(const torch::Tensor& permutation, int64_t epoch, int64_t k) const {
  if (window_tokens_ > 0) {
    const auto& starts = window_starts(epoch, permutation);
    GA_CHECK(k >= 0 && k + 1 < static_cast<int64_t>(starts.size()), "window {} out of range [0, {})", k,
             starts.size() - 1);
    return make_window(epoch, k,
                       permutation.slice(0, starts[static_cast<size_t>(k)], starts[static_cast<size_t>(k) + 1]));
  }
  GA_CHECK(k >= 0 && k < windows_per_epoch(), "window {} out of range [0, {})", k, windows_per_epoch());
  const int64_t begin = k * geometry_.global_batch();
  const int64_t end = std::min(begin + geometry_.global_batch(), dataset_size_);
  return make_window(epoch, k, permutation.slice(0, begin, end));
}

Window WindowPlan::make_window(int64_t epoch, int64_t index, torch::Tensor samples) const {
  if (grouped_) {
    // Longest first, ties in permutation order: micro-batches of similar
    // lengths waste less padding, and the window's set is unchanged.
    const auto order = std::get<1>(lengths_.index_select(0, samples).sort(/*stable=*/true, 0, /*descending=*/true));
    samples = samples.index_select(0, order);
  }
  if (token_budget_ > 0) return Window(epoch, index, samples, geometry_, token_budget_, lengths_);
  Window window(epoch, index, samples, geometry_, chunk_order_);
  if (lengths_.defined()) {
    const auto l = lengths_of(samples, lengths_);
    window.set_padding(padded_in_chunks_of(l, geometry_.micro_batch()),
                       std::accumulate(l.begin(), l.end(), int64_t{0}));
  }
  return window;
}

void WindowPlan::set_token_budget(int64_t tokens) {
  GA_CHECK(tokens >= 0, "key 'max_tokens_per_micro_batch': must be >= 0, got {}", tokens);
  GA_CHECK(tokens == 0 || lengths_.defined(),
           "key 'max_tokens_per_micro_batch': needs samples with lengths (a language model's data)");
  // validate() (trainer_options.h) refuses the options that would get here.
  GA_CHECK(tokens == 0 || chunk_order_ == ChunkOrder::interleaved,
           "WindowPlan: a token budget needs the interleaved chunk order");
  token_budget_ = tokens;
}

void WindowPlan::set_window_tokens(int64_t tokens, torch::Tensor items) {
  GA_CHECK(tokens >= 0, "key 'window_tokens': must be >= 0, got {}", tokens);
  if (tokens == 0) {
    window_tokens_ = 0;
    return;
  }
  GA_CHECK(items.defined(),
           "key 'window_tokens': this dataset's samples have no token count (windows of tokens need a causal "
           "language model's data)");
  GA_CHECK(items.dim() == 1 && items.size(0) == dataset_size_, "window_tokens: {} item counts for {} samples",
           items.numel(), dataset_size_);
  // validate() (trainer_options.h) refuses the options that would get here.
  GA_CHECK(!carries() && chunk_order_ == ChunkOrder::interleaved,
           "WindowPlan: windows of tokens need a plan that neither carries nor orders chunks contiguously");
  items = items.to(torch::kLong).contiguous();
  items_.assign(items.data_ptr<int64_t>(), items.data_ptr<int64_t>() + items.numel());
  window_tokens_ = tokens;
  starts_epoch_ = -1;
  const int64_t total = std::accumulate(items_.begin(), items_.end(), int64_t{0});
  GA_CHECK(windows_in_epoch(0) > 0,
           "key 'window_tokens': the training data holds {} tokens to predict, fewer than one window of {} with "
           "last_window: drop",
           total, tokens);
}

const torch::Tensor& WindowPlan::cached_permutation(int64_t epoch) const {
  for (const auto& [e, p] : permutations_) {
    if (e == epoch) return p;
  }
  if (permutations_.size() == 2) permutations_.erase(permutations_.begin());
  permutations_.emplace_back(epoch, permutation(epoch));
  return permutations_.back().second;
}

int64_t WindowPlan::epoch_of_carried_window(int64_t g) const { return g * geometry_.global_batch() / dataset_size_; }

Window WindowPlan::carried_window(int64_t g, int64_t epochs) const {
  GA_CHECK(carries(), "carried_window: the plan's last_window is not carry");
  const int64_t n = dataset_size_, B = geometry_.global_batch();
  const int64_t begin = g * B;
  const int64_t end = epochs > 0 ? std::min(begin + B, epochs * n) : begin + B;
  GA_CHECK(g >= 0 && begin < end, "window {} is beyond the stream of {} epochs", g, epochs);
  // The stream's positions [begin, end): the tails and heads of consecutive epochs' permutations
  // (several whole ones when B > n).
  std::vector<torch::Tensor> pieces;
  for (int64_t at = begin; at < end;) {
    const int64_t epoch = at / n, offset = at % n;
    const int64_t take = std::min(end - at, n - offset);
    pieces.push_back(cached_permutation(epoch).slice(0, offset, offset + take));
    at += take;
  }
  return make_window(epoch_of_carried_window(g), g, pieces.size() == 1 ? pieces.front() : torch::cat(pieces));
}

void WindowPlan::set_geometry(const BatchGeometry& geometry) {
  GA_CHECK(geometry.global_batch() == geometry_.global_batch() && geometry.world_size() == geometry_.world_size(),
           "set_geometry: {} is not a decomposition of {}", geometry.to_string(), geometry_.to_string());
  geometry_ = geometry;
}

void WindowPlan::set_lengths(torch::Tensor lengths) {
  GA_CHECK(lengths.dim() == 1 && lengths.size(0) == dataset_size_, "sample lengths: {} lengths for {} samples",
           lengths.numel(), dataset_size_);
  lengths_ = lengths.to(torch::kLong).contiguous();
}

void WindowPlan::group_by_length(torch::Tensor lengths) {
  set_lengths(std::move(lengths));
  grouped_ = true;
}

}  // namespace gradaccum::core
