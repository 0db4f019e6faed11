// Sequence classification samples: token ids and one class label per text,
// padded per micro-batch to its own longest row.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradaccum/core/trainable.h"
#include "gradaccum/data/byte_level_bpe.h"
#include "gradaccum/data/token_rows.h"

namespace gradaccum::data {

struct LabelledTokens {
  std::vector<TokenId> ids;
  int64_t label = 0;
};

struct ClassificationDatasetOptions {
  int64_t max_length = 512;   // tokens kept from the START of each text (> 0)
  TokenId pad_token_id = -1;  // required (>= 0)
  int64_t num_labels = 2;     // labels must be in [0, num_labels)
};

class SequenceClassificationDataset final : public core::Dataset {
 public:
  // Throws gradaccum::Error naming the example (its index in `examples`) whose
  // label is out of range or that has no tokens or a negative id, and on bad options.
  SequenceClassificationDataset(const std::vector<LabelledTokens>& examples, ClassificationDatasetOptions options);

  int64_t size() const override { return rows_.size(); }
  // input [B, T] int64 ids padded right with pad_token_id, T = the longest
  // selected row; attention_mask [B, T] int64 (1 real, 0 pad); target [B]
  // int64 labels. `dtype` is unused. An index outside [0, size()) throws.
  core::Batch get(const torch::Tensor& indices, torch::ScalarType dtype) const override;

  // Each example's token count after truncation (for length-grouped windows).
  const std::vector<int64_t>& lengths() const { return rows_.lengths(); }
  torch::Tensor sample_lengths() const override { return rows_.length_tensor(); }
  int64_t tokens() const { return rows_.tokens(); }
  const std::vector<int64_t>& labels() const { return labels_; }
  // Examples per class, [num_labels].
  std::vector<int64_t> label_counts() const;
  int64_t truncated_examples() const { return truncated_; }
  const ClassificationDatasetOptions& options() const { return options_; }

 private:
  ClassificationDatasetOptions options_;
  TokenRows rows_;
  std::vector<int64_t> labels_;
  int64_t truncated_ = 0;
};

// The splits of a classification task, as the task builders (kjv.h, text_classification.h)
// return them.
struct ClassificationData {
  std::shared_ptr<SequenceClassificationDataset> train;
  std::shared_ptr<SequenceClassificationDataset> eval;  // null when eval_fraction is 0
  std::shared_ptr<SequenceClassificationDataset> test;  // null unless the task has a test split
  int64_t num_labels = 0;
  std::vector<std::string> label_names;  // class id -> name, for id2label; empty: LABEL_0 ...
  std::string description;               // one line: what each split holds
};

}  // namespace gradaccum::data
