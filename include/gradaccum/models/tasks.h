// Task heads: turn a network's output into the (loss sum, count) the engine
// normalizes. They hold a network and know nothing of windows.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>

#include "gradaccum/core/trainable.h"
#include "gradaccum/models/sample_dropout.h"

namespace gradaccum::models {

// Cross-entropy over classes; one item per sample.
class Classifier final : public core::Trainable {
 public:
  explicit Classifier(torch::nn::Sequential net) : net_(std::move(net)), dropout_sites_(*net_) {}
  core::LossSum loss(const core::Batch& batch) override;
  core::EvalSums evaluate(const core::Batch& batch) override;
  torch::nn::Module& module() override { return *net_; }
  // One unit per module of the Sequential (those without parameters hold none).
  core::ParameterUnits units() override;
  void set_unit_scope(core::UnitScope* scope) override { unit_scope_ = scope; }
  torch::nn::Sequential& net() { return net_; }

 private:
  // The network's output: its modules in order, each in the unit scope when one is installed.
  torch::Tensor logits(const torch::Tensor& input);

  torch::nn::Sequential net_;
  core::UnitScope* unit_scope_ = nullptr;
  SampleDropoutSites dropout_sites_;
};

// Squared error; one item per target element (the mean of MSELoss).
// Holds a network whose forward maps one tensor to one tensor: a Sequential,
// a GeluMlp, or any other module holder.
class Regressor final : public core::Trainable {
 public:
  template <typename Impl>
  explicit Regressor(torch::nn::ModuleHolder<Impl> net)
      : module_(net.ptr()), forward_([net](const torch::Tensor& x) mutable { return net->forward(x); }) {}
  core::LossSum loss(const core::Batch& batch) override;
  core::EvalSums evaluate(const core::Batch& batch) override;
  torch::nn::Module& module() override { return *module_; }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::function<torch::Tensor(const torch::Tensor&)> forward_;
};

}  // namespace gradaccum::models
