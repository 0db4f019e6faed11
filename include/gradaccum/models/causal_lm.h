// Causal language modelling on any decoder (decoder.h): the tied LM head
// module, and the task head — next-token cross-entropy over the tokens that are
// not ignored, as a (sum, count) the engine normalizes over the whole window —
// the fix of trl#2175 / seed 000's GPT-2 experiment, where a per-micro-batch
// mean over-weights micro-batches with few real tokens.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <type_traits>

#include "gradaccum/core/trainable.h"
#include "gradaccum/models/decoder.h"
#include "gradaccum/models/sample_dropout.h"

namespace gradaccum::models {

// HF's *LMHeadModel / *ForCausalLM: a decoder registered as `transformer` and
// an output projection without bias. Tied (HF's tie_word_embeddings, the
// default), the projection is the token embedding, so the module has no
// parameter of its own and its names are the decoder's (transformer.*);
// untied, it is its own `lm_head.weight` [vocab, hidden], which starts as a
// copy of the embedding (a checkpoint then overwrites it). Gpt2's and Bloom's
// LM head models are this module built from their configs.
class CausalLmHeadImpl : public torch::nn::Module {
 public:
  explicit CausalLmHeadImpl(Decoder transformer, bool tie_word_embeddings = true);
  // Logits [B, T, vocab_size] = hidden states · head_weight()ᵀ.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});
  // The output projection [vocab, hidden]: the token embedding, or lm_head's weight.
  torch::Tensor head_weight();
  bool tied() const { return lm_head.is_empty(); }

  Decoder transformer{nullptr};
  torch::nn::Linear lm_head{nullptr};  // untied only
};
TORCH_MODULE(CausalLmHead);

// HF's causal-LM loss as a sum: labels are the input ids (not yet shifted);
// position t's logits predict labels[:, t + 1]. logits [B, T, V], labels [B, T].
// sum = Σ cross-entropy over shifted labels != core::kIgnoreIndex; count = the number
// of those labels — the same mask, after the shift. A row of n real tokens
// gives n - 1 targets under right padding; under left padding with only the
// padding labelled -100, its first real token is a target too (predicted from
// the pad before it), exactly as in HF — a collator that does not want that
// labels it -100 as well. This is the loss's definition on full logits, the
// reference the fused loss of CausalLm (chunked_cross_entropy.h) reproduces;
// training uses the fused one.
core::LossSum causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels);

// batch.input = token ids [B, T], batch.target = labels [B, T] (core::kIgnoreIndex =
// ignored), batch.attention_mask = [B, T] or undefined. Takes any LM head model
// (CausalLmHead, Gpt2LmHeadModel, BloomForCausalLm).
//
// The loss is chunked_causal_lm_loss (chunked_cross_entropy.h): the tied
// head's projection and the cross-entropy fused, the head's gradients computed
// in the forward. loss_chunk_tokens (the config key of the same name): K > 0
// never holds more than K × vocab logits; 0 (the default) chooses K so that a
// chunk's float32 logits take about 64 MiB on the CPU, 512 MiB on a GPU
// (chunk_tokens()). Every setting
// gives the loss, count and gradients of causal_lm_loss on the full logits up
// to rounding; evaluation follows the same setting.
class CausalLm final : public core::Trainable {
 public:
  explicit CausalLm(CausalLmHead model, int64_t loss_chunk_tokens = 0)
      : model_(std::move(model)), dropout_sites_(*model_) {
    set_loss_chunk_tokens(loss_chunk_tokens);
  }
  template <typename Impl, typename = std::enable_if_t<std::is_base_of_v<CausalLmHeadImpl, Impl> &&
                                                       !std::is_same_v<CausalLmHeadImpl, Impl>>>
  explicit CausalLm(const torch::nn::ModuleHolder<Impl>& model, int64_t loss_chunk_tokens = 0)
      : CausalLm(CausalLmHead(std::static_pointer_cast<CausalLmHeadImpl>(model.ptr())), loss_chunk_tokens) {}
  core::LossSum loss(const core::Batch& batch) override;
  // Loss sum and token count; `correct` is undefined.
  core::EvalSums evaluate(const core::Batch& batch) override;
  torch::nn::Module& module() override { return *model_; }
  core::ParameterUnits units() override { return model_->transformer->units(); }
  void set_unit_scope(core::UnitScope* scope) override { model_->transformer->set_unit_scope(scope); }
  CausalLmHead& model() { return model_; }
  // Throws gradaccum::Error naming loss_chunk_tokens when `tokens` < 0.
  void set_loss_chunk_tokens(int64_t tokens);
  int64_t loss_chunk_tokens() const { return loss_chunk_tokens_; }
  // The chunk the loss uses: loss_chunk_tokens, or the automatic size for 0.
  int64_t chunk_tokens();

 private:
  CausalLmHead model_;
  SampleDropoutSites dropout_sites_;
  int64_t loss_chunk_tokens_ = 0;
};

}  // namespace gradaccum::models
