// A synthetic language-modelling corpus: rows of uniformly random token ids,
// every row full (no padding), labels = inputs. It needs no tokenizer and no
// files, so a causal LM of any vocabulary can be trained and timed anywhere
// (the data-parallel GPT benchmark, bench/dist/); there is nothing to learn
// beyond the uniform distribution, so the loss tends to ln(vocab_size).
//
// Token (row r, column c) is a pure function of (seed, r, c): splitmix64 of a
// counter, reduced modulo vocab_size. The same on every platform and standard
// library, independent of how many rows are asked for, so the evaluation
// split (rows train_size, train_size + 1, ...) continues the training rows'
// stream without overlapping them.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "gradaccum/core/trainable.h"

namespace gradaccum::data {

struct RandomTokensOptions {
  int64_t vocab_size = 0;    // ids are drawn from [0, vocab_size); at least 2
  int64_t max_length = 128;  // tokens per row, every row full; at least 2
  int64_t rows = 4096;       // at least 1
  int64_t first_row = 0;     // the stream's row index of this dataset's row 0
  uint64_t seed = 0;
};

class RandomTokensDataset final : public core::Dataset {
 public:
  // Throws gradaccum::Error naming the bad option.
  explicit RandomTokensDataset(RandomTokensOptions options);

  int64_t size() const override { return ids_.size(0); }
  // input [B, max_length] int64 ids; target = input (the causal shift is the
  // loss's, models/causal_lm.h); no attention mask (there is no padding).
  // `dtype` is unused. An index outside [0, size()) throws gradaccum::Error.
  core::Batch get(const torch::Tensor& indices, torch::ScalarType dtype) const override;
  // Every row is max_length tokens long.
  torch::Tensor sample_lengths() const override;
  // max_length - 1 targets per row.
  torch::Tensor sample_items() const override { return sample_lengths() - 1; }

  const RandomTokensOptions& options() const { return options_; }
  const torch::Tensor& ids() const { return ids_; }  // [size(), max_length] int64
  // One line for the log: rows, row length, vocabulary, seed.
  std::string summary() const;

 private:
  RandomTokensOptions options_;
  torch::Tensor ids_;
};

// The training rows and, when eval_rows > 0, an evaluation split of eval_rows
// further rows of the same stream (null otherwise).
struct RandomTokensData {
  std::shared_ptr<RandomTokensDataset> train;
  std::shared_ptr<RandomTokensDataset> eval;
};
RandomTokensData make_random_tokens_data(int64_t vocab_size, int64_t max_length, int64_t train_rows, int64_t eval_rows,
                                         uint64_t seed);

}  // namespace gradaccum::data
