// Task heads: turn a network's output into the (loss sum, count) the engine
// normalizes. They hold any torch::nn::Sequential and know nothing of windows.
#pragma once

#include <torch/torch.h>

#include "gradaccum/core/trainable.h"

namespace gradaccum::models {

// Cross-entropy over classes; one item per sample.
class Classifier final : public core::Trainable {
 public:
  explicit Classifier(torch::nn::Sequential net) : net_(std::move(net)) {}
  core::LossSum loss(const core::Batch& batch) override;
  core::EvalSums evaluate(const core::Batch& batch) override;
  torch::nn::Module& module() override { return *net_; }
  torch::nn::Sequential& net() { return net_; }

 private:
  torch::nn::Sequential net_;
};

// Squared error; one item per target element (the mean of MSELoss).
class Regressor final : public core::Trainable {
 public:
  explicit Regressor(torch::nn::Sequential net) : net_(std::move(net)) {}
  core::LossSum loss(const core::Batch& batch) override;
  core::EvalSums evaluate(const core::Batch& batch) override;
  torch::nn::Module& module() override { return *net_; }
  torch::nn::Sequential& net() { return net_; }

 private:
  torch::nn::Sequential net_;
};

}  // namespace gradaccum::models
