#include "gradaccum/core/evaluator.h"

#include <chrono>

#include "gradaccum/base/check.h"

namespace gradaccum::core {

EvalRecord evaluate(Trainable& model, const Dataset& data, int64_t batch_size, torch::ScalarType dtype,
                    torch::Device device, MixedPrecision precision) {
  GA_CHECK(batch_size >= 1, "per_device_eval_batch_size must be >= 1, got {}", batch_size);
  const auto start = std::chrono::steady_clock::now();
  const bool was_training = model.module().is_training();
  model.module().eval();
  torch::NoGradGuard no_grad;

  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  auto count = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  bool has_correct = false;
  const auto all = torch::arange(data.size(), torch::kLong);
  for (int64_t begin = 0; begin < data.size(); begin += batch_size) {
    auto batch = data.get(all.slice(0, begin, begin + batch_size), dtype);
    batch.input = batch.input.to(device);
    if (batch.target.defined()) batch.target = batch.target.to(device);
    if (batch.attention_mask.defined()) batch.attention_mask = batch.attention_mask.to(device);
    EvalSums sums;
    {
      AutocastScope autocast(precision, device);
      sums = model.evaluate(batch);
    }
    loss_sum.add_(sums.loss_sum.to(torch::kDouble));
    count.add_(sums.count);
    if (sums.correct.defined()) {
      correct.add_(sums.correct);
      has_correct = true;
    }
  }
  if (was_training) model.module().train();

  // One host synchronization for the whole evaluation.
  auto host = torch::stack({loss_sum, count.to(torch::kDouble), correct.to(torch::kDouble)}).to(torch::kCPU);
  auto values = host.accessor<double, 1>();
  EvalRecord record;
  record.items = static_cast<int64_t>(values[1]);
  record.samples = data.size();
  record.loss = values[0] / std::max<double>(1.0, values[1]);
  if (has_correct) record.accuracy = values[2] / std::max<double>(1.0, static_cast<double>(data.size()));
  record.time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return record;
}

}  // namespace gradaccum::core
