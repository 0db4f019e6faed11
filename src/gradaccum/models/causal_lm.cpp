#include "gradaccum/models/causal_lm.h"

#include <algorithm>
#include <cstdint>

#include "gradaccum/base/check.h"
#include "gradaccum/models/chunked_cross_entropy.h"

namespace gradaccum::models {

CausalLmHeadImpl::CausalLmHeadImpl(Decoder backbone, bool tie_word_embeddings) {
  transformer = register_module("transformer", std::move(backbone));
  if (!tie_word_embeddings) {
    const auto embedding = transformer->token_embedding();
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(embedding.size(1), embedding.size(0)).bias(false)));
    torch::NoGradGuard no_grad;
    lm_head->weight.copy_(embedding);
  }
}

torch::Tensor CausalLmHeadImpl::head_weight() { return tied() ? transformer->token_embedding() : lm_head->weight; }

torch::Tensor CausalLmHeadImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  return torch::nn::functional::linear(transformer->hidden_states(input_ids, attention_mask), head_weight());
}

core::LossSum causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels) {
  TORCH_CHECK(
      logits.dim() == 3 && labels.dim() == 2 && logits.size(0) == labels.size(0) && logits.size(1) == labels.size(1),
      "causal LM: logits ", logits.sizes(), " do not match labels ", labels.sizes());
  const int64_t time = logits.size(1);
  // Shift: logits at t predict the label at t + 1; the last position predicts nothing.
  auto shifted_logits = logits.slice(1, 0, time - 1).reshape({-1, logits.size(2)});
  auto shifted_labels = labels.slice(1, 1, time).reshape({-1}).to(torch::kLong);
  // Summed, not averaged: the engine divides by the window's count (DESIGN.md §1).
  auto sum = torch::nn::functional::cross_entropy(
      shifted_logits, shifted_labels,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(core::kIgnoreIndex));
  // The count of exactly the labels cross_entropy did not ignore: after the
  // shift, so a row's first token (never a target) is not counted and a row
  // with n real tokens contributes n - 1.
  auto count = shifted_labels.ne(core::kIgnoreIndex).sum();
  return {sum, count};
}

void CausalLm::set_loss_chunk_tokens(int64_t tokens) {
  GA_CHECK(tokens >= 0, "loss_chunk_tokens must be 0 (plain loss) or positive, got {}", tokens);
  loss_chunk_tokens_ = tokens;
}

int64_t CausalLm::chunk_tokens() {
  if (loss_chunk_tokens_ > 0) return loss_chunk_tokens_;
  // Automatic: a chunk's float32 logits near a fixed budget, large enough for
  // efficient matmuls, small enough that memory does not grow with micro-batch
  // × vocabulary. On the CPU 64 MiB (333 tokens at GPT-2's 50257, 2048 at a
  // vocabulary of 8192). A GPU needs longer chunks to keep its matmuls busy: the
  // head's weight gradient sums over the chunk's tokens, and GPT-2 124M in bf16
  // on an H200 ran at 0.83× the full-logits loop's speed with 333-token chunks,
  // 0.97× with 2048 (BENCHMARKS.md); 512 MiB there (2670 tokens at 50257).
  const auto& table = model_->transformer->token_embedding();
  const int64_t budget = table.is_cpu() ? int64_t{64} << 20 : int64_t{512} << 20;
  return std::max<int64_t>(1, budget / (table.size(0) * static_cast<int64_t>(sizeof(float))));
}

core::LossSum CausalLm::loss(const core::Batch& batch) {
  // A tied head's part of the table's gradient comes from the fused loss, dense. On the CPU
  // the lookup adds its rows into that gradient in place (tied_table_gradient.h) rather than
  // leaving autograd to sum a dense and a sparse gradient out of place. An untied head leaves
  // the lookup as the table's only gradient: dense, until the table holds a dense gradient of
  // the window's earlier micro-steps that autograd adds sparse rows into in place. Only on the
  // CPU: on a GPU adding rows with repeated ids in place is not deterministic, and coalescing
  // sparse rows reads their count on the host, a synchronization per micro-step
  // (base/host_reads.h); there both gradients are dense and autograd adds them in place.
  dropout_sites_.set_keys(batch.keys);
  auto& transformer = model_->transformer;
  const auto head = model_->head_weight();
  const auto& table = transformer->token_embedding();
  c10::intrusive_ptr<TiedTableGradient> pairing;
  auto lookup_grad = TokenEmbeddingGrad::dense();
  if (head.is_cpu() && model_->tied()) {
    pairing = c10::make_intrusive<TiedTableGradient>();
    lookup_grad = TokenEmbeddingGrad::into(pairing);
  } else if (head.is_cpu() && holds_dense_grad(table)) {
    lookup_grad = TokenEmbeddingGrad::sparse();
  }
  return chunked_causal_lm_loss(transformer->hidden_states(batch.input, batch.attention_mask, lookup_grad), head,
                                batch.target, chunk_tokens(), TargetSelection::automatic, pairing);
}

core::EvalSums CausalLm::evaluate(const core::Batch& batch) {
  auto l = loss(batch);
  return {l.sum, l.count, torch::Tensor()};
}

}  // namespace gradaccum::models
