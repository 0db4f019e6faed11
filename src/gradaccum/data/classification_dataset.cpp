#include "gradaccum/data/classification_dataset.h"

#include <algorithm>

#include "gradaccum/base/check.h"

namespace gradaccum::data {

SequenceClassificationDataset::SequenceClassificationDataset(const std::vector<LabelledTokens>& examples,
                                                             ClassificationDatasetOptions options)
    : options_(options) {
  GA_CHECK(options_.max_length > 0, "classification dataset: max_length must be > 0, got {}", options_.max_length);
  GA_CHECK(options_.pad_token_id >= 0, "classification dataset: pad_token_id must be >= 0, got {}",
           options_.pad_token_id);
  GA_CHECK(options_.num_labels >= 2, "classification dataset: num_labels must be >= 2, got {}", options_.num_labels);
  GA_CHECK(!examples.empty(), "classification dataset: no examples");
  labels_.reserve(examples.size());
  for (std::size_t i = 0; i < examples.size(); ++i) {
    const auto& e = examples[i];
    GA_CHECK(e.label >= 0 && e.label < options_.num_labels,
             "classification dataset: example {} has label {}, outside [0, {})", i, e.label, options_.num_labels);
    // A row without tokens has nothing to classify from (and no last token to pool).
    GA_CHECK(!e.ids.empty(), "classification dataset: example {} has no tokens", i);
    const auto n = static_cast<int64_t>(e.ids.size());
    if (n > options_.max_length) ++truncated_;
    rows_.add(e.ids.data(), std::min(n, options_.max_length), fmt::format("classification dataset: example {}", i));
    labels_.push_back(e.label);
  }
}

core::Batch SequenceClassificationDataset::get(const torch::Tensor& indices, torch::ScalarType) const {
  auto rows = rows_.gather(indices, options_.pad_token_id, "classification dataset");
  core::Batch batch;
  batch.target =
      torch::from_blob(const_cast<int64_t*>(labels_.data()), {static_cast<int64_t>(labels_.size())}, torch::kLong)
          .index_select(0, indices.to(torch::kCPU, torch::kLong));
  batch.input = std::move(rows.ids);
  batch.attention_mask = std::move(rows.mask);
  batch.samples = batch.input.size(0);
  return batch;
}

std::vector<int64_t> SequenceClassificationDataset::label_counts() const {
  std::vector<int64_t> counts(options_.num_labels, 0);
  for (auto l : labels_) ++counts[l];
  return counts;
}

}  // namespace gradaccum::data
