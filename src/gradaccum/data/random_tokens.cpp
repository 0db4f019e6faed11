#include "gradaccum/data/random_tokens.h"

#include "gradaccum/base/check.h"

namespace gradaccum::data {

namespace {

// splitmix64's output function (Steele, Lea & Flood 2014): consecutive inputs
// give statistically independent outputs, so a counter is a random stream.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

RandomTokensDataset::RandomTokensDataset(RandomTokensOptions options) : options_(options) {
  GA_CHECK(options_.vocab_size >= 2, "random tokens: vocab_size must be >= 2, got {}", options_.vocab_size);
  GA_CHECK(options_.max_length >= 2, "random tokens: max_length must be >= 2 (one input, one target), got {}",
           options_.max_length);
  GA_CHECK(options_.rows >= 1, "random tokens: rows must be >= 1, got {}", options_.rows);
  GA_CHECK(options_.first_row >= 0, "random tokens: first_row must be >= 0, got {}", options_.first_row);
  const int64_t n = options_.rows * options_.max_length;
  ids_ = torch::empty({options_.rows, options_.max_length}, torch::kLong);
  auto* out = ids_.data_ptr<int64_t>();
  // The seed picks a stream far from the others' (splitmix64 of the seed),
  // the counter walks it; the modulo bias is < vocab / 2^64.
  const uint64_t base = splitmix64(options_.seed);
  const auto vocab = static_cast<uint64_t>(options_.vocab_size);
  const auto first = static_cast<uint64_t>(options_.first_row * options_.max_length);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<int64_t>(splitmix64(base + first + static_cast<uint64_t>(i)) % vocab);
  }
}

core::Batch RandomTokensDataset::get(const torch::Tensor& indices, torch::ScalarType) const {
  GA_CHECK(indices.numel() == 0 || (indices.min().item<int64_t>() >= 0 && indices.max().item<int64_t>() < size()),
           "random tokens: sample index out of range [0, {})", size());
  core::Batch batch;
  batch.input = ids_.index_select(0, indices.to(torch::kLong));
  batch.target = batch.input;  // never written to: the loss shifts a view of it
  batch.samples = batch.input.size(0);
  return batch;
}

torch::Tensor RandomTokensDataset::sample_lengths() const {
  return torch::full({size()}, options_.max_length, torch::kLong);
}

std::string RandomTokensDataset::summary() const {
  return fmt::format("random tokens: {} rows of {} ids in [0, {}), seed {}", size(), options_.max_length,
                     options_.vocab_size, options_.seed);
}

RandomTokensData make_random_tokens_data(int64_t vocab_size, int64_t max_length, int64_t train_rows, int64_t eval_rows,
                                         uint64_t seed) {
  RandomTokensOptions options;
  options.vocab_size = vocab_size;
  options.max_length = max_length;
  options.rows = train_rows;
  options.seed = seed;
  RandomTokensData data;
  data.train = std::make_shared<RandomTokensDataset>(options);
  if (eval_rows > 0) {
    options.rows = eval_rows;
    options.first_row = train_rows;
    data.eval = std::make_shared<RandomTokensDataset>(options);
  }
  return data;
}

}  // namespace gradaccum::data
