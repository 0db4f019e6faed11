// Sequence classification on any decoder (decoder.h), as HF's
// GPT2ForSequenceClassification / BloomForSequenceClassification: a linear
// `score` (hidden → num_labels, no bias) on the hidden state of each row's last
// real token, which in a causal decoder is the only one that has seen the whole
// sequence.
//
// The last real token is the last position where attention_mask is 1, so left
// padding, right padding and any amount of extra padding pool the same token.
// (HF finds it from pad_token_id in input_ids instead; the mask needs no pad id
// and cannot mistake a real token equal to the pad id for padding.) Without a
// mask, the last position.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "gradaccum/core/trainable.h"
#include "gradaccum/models/decoder.h"
#include "gradaccum/models/sample_dropout.h"

namespace gradaccum::models {

// For each row, the index of its last real token: [B] int64. attention_mask
// [B, T] (1 = real); a row without a real token gives 0.
torch::Tensor last_real_token(const torch::Tensor& attention_mask);

class SequenceClassificationModelImpl : public torch::nn::Module {
 public:
  // `score` is initialized as HF does, N(0, initializer_range), from its own
  // generator seeded with init_seed; the backbone keeps its weights.
  SequenceClassificationModelImpl(Decoder transformer, int64_t num_labels, double initializer_range = 0.02,
                                  uint64_t init_seed = 0);
  // Logits [B, num_labels]. input_ids [B, T]; attention_mask [B, T] or undefined.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});
  int64_t num_labels() const { return num_labels_; }

  Decoder transformer{nullptr};
  torch::nn::Linear score{nullptr};

 private:
  int64_t num_labels_;
};
TORCH_MODULE(SequenceClassificationModel);

// batch.input = token ids [B, T], batch.attention_mask = [B, T] or undefined,
// batch.target = labels [B] int64 in [0, num_labels). One item per row: sum =
// Σ cross-entropy over rows, count = rows, so the window loss is the mean over
// all of the window's rows however they were split.
class SequenceClassifier final : public core::Trainable {
 public:
  explicit SequenceClassifier(SequenceClassificationModel model) : model_(std::move(model)), dropout_sites_(*model_) {}
  core::LossSum loss(const core::Batch& batch) override;
  // Loss sum, rows, and `correct` = rows whose argmax logit is the label.
  core::EvalSums evaluate(const core::Batch& batch) override;
  torch::nn::Module& module() override { return *model_; }
  core::ParameterUnits units() override { return model_->transformer->units(); }
  void set_unit_scope(core::UnitScope* scope) override { model_->transformer->set_unit_scope(scope); }
  SequenceClassificationModel& model() { return model_; }

 private:
  // Checks batch.target against the logits and returns the loss sum.
  torch::Tensor loss_sum(const torch::Tensor& logits, const core::Batch& batch) const;

  SequenceClassificationModel model_;
  SampleDropoutSites dropout_sites_;
};

}  // namespace gradaccum::models
