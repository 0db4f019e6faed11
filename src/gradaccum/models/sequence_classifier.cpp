#include "gradaccum/models/sequence_classifier.h"

#include <ATen/CPUGeneratorImpl.h>

#include "gradaccum/base/check.h"
#include "gradaccum/base/host_reads.h"

namespace gradaccum::models {

torch::Tensor last_real_token(const torch::Tensor& attention_mask) {
  // The largest position whose mask is nonzero: max over t of t·[mask ≠ 0].
  auto positions =
      torch::arange(attention_mask.size(1), torch::TensorOptions().dtype(torch::kLong).device(attention_mask.device()));
  return (positions.unsqueeze(0) * attention_mask.ne(0).to(torch::kLong)).amax(1);
}

SequenceClassificationModelImpl::SequenceClassificationModelImpl(Decoder backbone, int64_t num_labels,
                                                                 double initializer_range, uint64_t init_seed)
    : num_labels_(num_labels) {
  GA_CHECK(num_labels > 0, "sequence classifier: num_labels must be positive, got {}", num_labels);
  transformer = register_module("transformer", std::move(backbone));
  score = register_module(
      "score", torch::nn::Linear(torch::nn::LinearOptions(transformer->hidden_size(), num_labels).bias(false)));
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(init_seed);
  score->weight.normal_(0.0, initializer_range, generator);
}

torch::Tensor SequenceClassificationModelImpl::forward(const torch::Tensor& input_ids,
                                                       const torch::Tensor& attention_mask) {
  // Once the table holds a dense gradient (every micro-step of a window but its first), the
  // lookup hands back its rows sparsely and autograd adds them into that gradient in place,
  // instead of zero-filling and adding a [vocab, hidden] tensor: 1 GB and 0.4 s per micro-step
  // at BLOOM-560m's 250880 × 1024. Only on the CPU (causal_lm.cpp says why).
  const auto& table = transformer->token_embedding();
  const bool rows_only = is_training() && table.is_cpu() && holds_dense_grad(table);
  auto hidden =
      transformer->hidden_states(input_ids, attention_mask,
                                 rows_only ? TokenEmbeddingGrad::sparse() : TokenEmbeddingGrad::dense());  // [B, T, C]
  const int64_t rows = hidden.size(0), time = hidden.size(1);
  auto last = attention_mask.defined()
                  ? last_real_token(attention_mask)
                  : torch::full({rows}, time - 1, torch::TensorOptions().dtype(torch::kLong).device(hidden.device()));
  // Score only the pooled states ([B, C]), not every position as HF does.
  auto pooled = hidden.gather(1, last.view({rows, 1, 1}).expand({rows, 1, hidden.size(2)})).squeeze(1);
  return score->forward(pooled);
}

torch::Tensor SequenceClassifier::loss_sum(const torch::Tensor& logits, const core::Batch& batch) const {
  const auto& labels = batch.target;
  GA_CHECK(labels.defined() && labels.dim() == 1 && labels.size(0) == logits.size(0),
           "sequence classifier: labels must be [{}] (one per row), got {}", logits.size(0),
           labels.defined() ? fmt::format("{} dims of shape [{}]", labels.dim(), fmt::join(labels.sizes(), ", "))
                            : std::string("undefined"));
  GA_CHECK(labels.scalar_type() == torch::kLong, "sequence classifier: labels must be int64, got {}",
           c10::toString(labels.scalar_type()));
  if (labels.device().is_cpu() && labels.numel() > 0) {
    GRADACCUM_CPU_HOST_READ_SCOPE();  // free on the CPU; elsewhere the data layer checked them
    const int64_t low = labels.min().item<int64_t>(), high = labels.max().item<int64_t>();
    GA_CHECK(low >= 0 && high < model_->num_labels(),
             "sequence classifier: labels must lie in [0, num_labels = {}), got values in [{}, {}]",
             model_->num_labels(), low, high);
  }
  // Summed, not averaged: the engine divides by the window's row count (DESIGN.md §1).
  return torch::nn::functional::cross_entropy(logits, labels,
                                              torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

core::LossSum SequenceClassifier::loss(const core::Batch& batch) {
  dropout_sites_.set_keys(batch.keys);
  auto logits = model_->forward(batch.input, batch.attention_mask);
  auto count = torch::scalar_tensor(logits.size(0), torch::TensorOptions().dtype(torch::kLong).device(logits.device()));
  return {loss_sum(logits, batch), count};
}

core::EvalSums SequenceClassifier::evaluate(const core::Batch& batch) {
  auto logits = model_->forward(batch.input, batch.attention_mask);
  auto count = torch::scalar_tensor(logits.size(0), torch::TensorOptions().dtype(torch::kLong).device(logits.device()));
  auto correct = logits.argmax(1).eq(batch.target).sum();
  return {loss_sum(logits, batch), count, correct};
}

}  // namespace gradaccum::models
