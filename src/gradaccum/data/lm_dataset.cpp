#include "gradaccum/data/lm_dataset.h"

#include <algorithm>

#include "gradaccum/base/check.h"
#include "gradaccum/core/batch.h"

namespace gradaccum::data {

CausalLmDataset::CausalLmDataset(const std::vector<std::vector<TokenId>>& documents, LmDatasetOptions options)
    : options_(options), documents_(static_cast<int64_t>(documents.size())) {
  GA_CHECK(options_.max_length >= 2,
           "lm dataset: max_length must be at least 2 (one input and one target token), got {}", options_.max_length);
  if (options_.packing) {
    GA_CHECK(options_.eos_token_id >= 0, "lm dataset: packing needs eos_token_id (the separator between documents)");
  } else {
    GA_CHECK(options_.pad_token_id >= 0, "lm dataset: padding needs pad_token_id (>= 0)");
  }
  for (std::size_t d = 0; d < documents.size(); ++d) {
    const auto& doc = documents[d];
    const auto negative = std::find_if(doc.begin(), doc.end(), [](TokenId t) { return t < 0; });
    GA_CHECK(negative == doc.end(), "lm dataset: document {} has a negative token id {}", d,
             negative == doc.end() ? 0 : *negative);
  }

  const int64_t length = options_.max_length;
  if (!options_.packing) {
    for (const auto& doc : documents) {
      const auto n = static_cast<int64_t>(doc.size());
      if (n < 2) {
        ++dropped_;
        continue;
      }
      if (n > length) ++truncated_;
      rows_.add(doc.data(), std::min(n, length), "lm dataset");
    }
  } else {
    // HF run_clm's group_texts: one stream, cut into full blocks.
    std::vector<TokenId> stream;
    for (const auto& doc : documents) {
      if (doc.size() < 2) {
        ++dropped_;
        continue;
      }
      stream.insert(stream.end(), doc.begin(), doc.end());
      stream.push_back(options_.eos_token_id);
    }
    const auto total = static_cast<int64_t>(stream.size());
    for (int64_t begin = 0; begin + length <= total; begin += length)
      rows_.add(stream.data() + begin, length, "lm dataset");
    dropped_tail_ = total % length;
  }
  GA_CHECK(size() > 0, "lm dataset: no samples from {} documents ({} with fewer than 2 tokens{})", documents_, dropped_,
           options_.packing ? fmt::format(", {} tokens in all, less than one block of {}", dropped_tail_, length)
                            : std::string());
}

core::Batch CausalLmDataset::get(const torch::Tensor& indices, torch::ScalarType) const {
  // The pad id only fills cells the mask marks as padding: with packing there are none.
  auto rows = rows_.gather(indices, std::max<TokenId>(options_.pad_token_id, 0), "lm dataset");
  core::Batch batch;
  batch.target = rows.ids.masked_fill(rows.mask.eq(0), core::kIgnoreIndex);
  batch.input = std::move(rows.ids);
  batch.attention_mask = std::move(rows.mask);
  batch.samples = batch.input.size(0);
  return batch;
}

std::string CausalLmDataset::summary() const {
  std::string cut = options_.packing ? fmt::format("packed into blocks of {} ({} tail tokens dropped)",
                                                   options_.max_length, dropped_tail_)
                                     : fmt::format("{} truncated to {} tokens", truncated_, options_.max_length);
  return fmt::format("{} documents, {} dropped (< 2 tokens), {}: {} samples, {} tokens", documents_, dropped_, cut,
                     size(), tokens());
}

}  // namespace gradaccum::data
