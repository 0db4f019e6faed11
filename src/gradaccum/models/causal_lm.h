// Causal language modelling as a task head: next-token cross-entropy over the
// tokens that are not ignored, as a (sum, count) the engine normalizes over the
// whole window — the fix of trl#2175 / seed 000's GPT-2 experiment, where a
// per-micro-batch mean over-weights micro-batches with few real tokens.
#pragma once

#include <torch/torch.h>

#include "gradaccum/core/trainable.h"
#include "gradaccum/models/gpt2.h"

namespace gradaccum::models {

// Labels equal to this value contribute neither loss nor count (HF's convention).
inline constexpr int64_t kIgnoreIndex = -100;

// HF's causal-LM loss as a sum: labels are the input ids (not yet shifted);
// position t's logits predict labels[:, t + 1]. logits [B, T, V], labels [B, T].
// sum = Σ cross-entropy over shifted labels != kIgnoreIndex; count = the number
// of those labels — the same mask, after the shift. A row of n real tokens
// gives n - 1 targets under right padding; under left padding with only the
// padding labelled -100, its first real token is a target too (predicted from
// the pad before it), exactly as in HF — a collator that does not want that
// labels it -100 as well.
core::LossSum causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels);

// batch.input = token ids [B, T], batch.target = labels [B, T] (kIgnoreIndex =
// ignored), batch.attention_mask = [B, T] or undefined.
class CausalLm final : public core::Trainable {
 public:
  explicit CausalLm(Gpt2LmHeadModel model) : model_(std::move(model)) {}
  core::LossSum loss(const core::Batch& batch) override;
  // Loss sum and token count; `correct` is undefined.
  core::EvalSums evaluate(const core::Batch& batch) override;
  torch::nn::Module& module() override { return *model_; }
  Gpt2LmHeadModel& model() { return model_; }

 private:
  Gpt2LmHeadModel model_;
};

}  // namespace gradaccum::models
