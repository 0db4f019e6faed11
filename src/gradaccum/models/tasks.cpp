#include "gradaccum/models/tasks.h"

namespace gradaccum::models {

namespace {
torch::Tensor count_tensor(int64_t n, const torch::Tensor& like) {
  return torch::full({}, n, torch::TensorOptions().dtype(torch::kLong).device(like.device()));
}
}  // namespace

core::LossSum Classifier::loss(const core::Batch& batch) {
  auto logits = net_->forward(batch.input);
  auto sum = torch::nn::functional::cross_entropy(
      logits, batch.target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  return {sum, count_tensor(batch.target.size(0), logits)};
}

core::EvalSums Classifier::evaluate(const core::Batch& batch) {
  auto logits = net_->forward(batch.input);
  auto sum = torch::nn::functional::cross_entropy(
      logits, batch.target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  auto correct = logits.argmax(1).eq(batch.target).sum();
  return {sum, count_tensor(batch.target.size(0), logits), correct};
}

core::LossSum Regressor::loss(const core::Batch& batch) {
  auto prediction = net_->forward(batch.input);
  auto sum = (prediction - batch.target).square().sum();
  return {sum, count_tensor(batch.target.numel(), prediction)};
}

core::EvalSums Regressor::evaluate(const core::Batch& batch) {
  auto l = loss(batch);
  return {l.sum, l.count, torch::Tensor()};
}

}  // namespace gradaccum::models
