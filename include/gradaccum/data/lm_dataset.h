// Causal language-model samples from tokenized documents, in either of the
// two layouts of Hugging Face's examples:
//  - one document per sample (truncated to max_length), padded per micro-batch
//    to its own longest row (dynamic padding), labels -100 on the padding;
//  - packing (run_clm's group_texts): documents joined with an EOS separator
//    into one stream cut into blocks of exactly max_length tokens, no padding;
//    attention crosses document boundaries inside a block, as in run_clm.
// Labels are the input ids, not shifted: the loss shifts them
// (models/causal_lm.h), so a row of n real tokens gives n - 1 targets.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradaccum/core/trainable.h"
#include "gradaccum/data/byte_level_bpe.h"
#include "gradaccum/data/token_rows.h"

namespace gradaccum::data {

struct LmDatasetOptions {
  // Tokens per sample at most (each document's first max_length tokens without
  // packing; the block size with packing). At least 2: one input, one target.
  int64_t max_length = 1024;
  bool packing = false;
  TokenId pad_token_id = -1;  // fills the padding; required (>= 0) without packing
  TokenId eos_token_id = -1;  // appended to each document with packing; required then
};

class CausalLmDataset final : public core::Dataset {
 public:
  // Documents of fewer than 2 tokens have nothing to predict: they are dropped
  // (in both layouts) and counted in dropped_documents(). Throws
  // gradaccum::Error on bad options or a negative token id.
  CausalLmDataset(const std::vector<std::vector<TokenId>>& documents, LmDatasetOptions options);

  int64_t size() const override { return rows_.size(); }
  // input [B, T] int64 ids, T = the longest selected sample (pad_token_id after
  // a row's end); target [B, T] int64 = input with -100 on the padding;
  // attention_mask [B, T] int64, 1 on real tokens and 0 on padding. With
  // packing T = max_length and the mask is all ones. `dtype` is unused (ids
  // are integers). An index outside [0, size()) throws gradaccum::Error.
  core::Batch get(const torch::Tensor& indices, torch::ScalarType dtype) const override;

  // Each sample's real token count (for length-grouped windows), and their sum.
  const std::vector<int64_t>& lengths() const { return rows_.lengths(); }
  torch::Tensor sample_lengths() const override { return rows_.length_tensor(); }
  // A row of n real tokens has n - 1 targets (the loss shifts the labels; padding is ignored).
  torch::Tensor sample_items() const override { return rows_.length_tensor() - 1; }
  int64_t tokens() const { return rows_.tokens(); }

  int64_t documents() const { return documents_; }               // as given
  int64_t dropped_documents() const { return dropped_; }         // < 2 tokens
  int64_t truncated_documents() const { return truncated_; }     // without packing
  int64_t dropped_tail_tokens() const { return dropped_tail_; }  // with packing
  const LmDatasetOptions& options() const { return options_; }
  // One line for the log: documents, what was dropped or cut, samples, tokens.
  std::string summary() const;

 private:
  LmDatasetOptions options_;
  TokenRows rows_;  // one per sample
  int64_t documents_ = 0;
  int64_t dropped_ = 0;
  int64_t truncated_ = 0;
  int64_t dropped_tail_ = 0;
};

// A train/eval pair, as the task builders (kjv.h) return them.
struct CausalLmData {
  std::shared_ptr<CausalLmDataset> train;
  std::shared_ptr<CausalLmDataset> eval;  // null when eval_fraction is 0
};

}  // namespace gradaccum::data
