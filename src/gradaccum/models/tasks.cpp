#include "gradaccum/models/tasks.h"

namespace gradaccum::models {

namespace {
torch::Tensor count_tensor(int64_t n, const torch::Tensor& like) {
  // scalar_tensor: one dispatch instead of full's three (empty, fill_); runs every micro-step.
  return torch::scalar_tensor(n, torch::TensorOptions().dtype(torch::kLong).device(like.device()));
}
}  // namespace

core::ParameterUnits Classifier::units() {
  core::ParameterUnits units;
  for (const auto& child : net_->children()) {
    std::vector<torch::Tensor> trainable;
    for (const auto& p : child->parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    units.push_back(std::move(trainable));
  }
  return units;
}

torch::Tensor Classifier::logits(const torch::Tensor& input) {
  if (unit_scope_ == nullptr) return net_->forward(input);
  auto x = input;
  int64_t unit = 0;
  for (auto& module : *net_) {
    x = core::run_unit(unit_scope_, unit++, x, [&](const torch::Tensor& in) { return module.forward(in); });
  }
  return x;
}

core::LossSum Classifier::loss(const core::Batch& batch) {
  dropout_sites_.set_keys(batch.keys);
  auto logits = this->logits(batch.input);
  auto sum = torch::nn::functional::cross_entropy(
      logits, batch.target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  return {sum, count_tensor(batch.target.size(0), logits)};
}

core::EvalSums Classifier::evaluate(const core::Batch& batch) {
  auto logits = this->logits(batch.input);
  auto sum = torch::nn::functional::cross_entropy(
      logits, batch.target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  auto correct = logits.argmax(1).eq(batch.target).sum();
  return {sum, count_tensor(batch.target.size(0), logits), correct};
}

core::LossSum Regressor::loss(const core::Batch& batch) {
  auto prediction = forward_(batch.input);
  // Σ (prediction - target)². mse_loss(sum) is the same arithmetic (forward
  // d·d then sum; backward 2·d·grad, bit-identical to the chain sub → square →
  // sum) in one op and one autograd node instead of three: the per-node cost of
  // the autograd engine dominates small models. Shapes that broadcast keep the
  // explicit chain, whose broadcasting mse_loss would only warn about (and
  // mixed dtypes keep it too, for the same promotion).
  const bool same_shape =
      prediction.sizes() == batch.target.sizes() && prediction.scalar_type() == batch.target.scalar_type();
  auto sum = same_shape ? torch::mse_loss(prediction, batch.target, at::Reduction::Sum)
                        : (prediction - batch.target).square().sum();
  return {sum, count_tensor(batch.target.numel(), prediction)};
}

core::EvalSums Regressor::evaluate(const core::Batch& batch) {
  auto l = loss(batch);
  return {l.sum, l.count, torch::Tensor()};
}

}  // namespace gradaccum::models
