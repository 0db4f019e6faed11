// Small helpers shared by the benchmark programs under bench/.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "gradaccum/base/check.h"
#include "gradaccum/core/trainer.h"

namespace gradaccum::bench {

// The median of `v` (the mean of the two middle values for an even count).
inline double median(std::vector<double> v) {
  GA_CHECK(!v.empty(), "median of no values");
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// max |a - b| / max |b|: how far two paths' results are apart, relative to the result's scale.
inline double max_relative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item<double>();
}

// A command-line count (an integer >= 0); throws gradaccum::Error naming the
// program and the option otherwise.
inline int64_t parse_count(const std::string& program, const std::string& key, const std::string& value) {
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  GA_CHECK(used == value.size() && used > 0 && n >= 0, "{}: {} '{}' is not a count", program, key, value);
  return n;
}

// The engine's options both engine benchmarks train with: micro-batch b × N
// accumulation steps for `steps` optimizer steps, AdamW at lr 1e-3, clipping
// at 1.0, the engine's defaults otherwise (cosine schedule).
inline core::TrainerOptions adamw_trainer_options(int64_t b, int64_t accumulation, int64_t steps) {
  core::TrainerOptions options;
  options.per_device_train_batch_size = b;
  options.gradient_accumulation_steps = accumulation;
  options.max_steps = steps;
  options.optimizer.type = optim::OptimizerType::adamw;
  options.optimizer.learning_rate = 1e-3;
  options.max_grad_norm = 1.0;
  return options;
}

}  // namespace gradaccum::bench
