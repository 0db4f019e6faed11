// Seed 000's MLP micro-step benchmark: Linear(16, 32) → GELU → Linear(32, 1)
// (models::seed000_mlp) as a models::Regressor, trained by core::Trainer on an
// in-memory dataset of random (x[16], y[1]) samples with micro-batch 1 × 16
// accumulation steps, AdamW, cosine schedule, clipping at 1.0 (the engine's
// defaults). The model is so small that the time is the engine's and
// libtorch's fixed cost per micro-step: fetch, forward, loss, backward, plus
// the optimizer step amortized over 16 micro-steps.
//
//   mlp_microstep [--threads 1] [--warmup-steps 20] [--repeats 7] [--steps 50] [--raw | --unfused]
//                 [--custom-kernels all|none|LIST]
//
// --custom-kernels is `gradaccum train`'s custom_kernels (kernels/custom_kernels.h).
//
// The engine trains seed000_mlp(), a models::GeluMlp, which on these sizes is
// one fused autograd node. --unfused trains the plain Sequential of libtorch
// layers instead (seed000_sequential_mlp()): what the fusion buys. --raw runs
// the loop written directly against libtorch on that Sequential, without the
// engine (no Trainer, window plan, normalizer or observers): the floor that
// libtorch's own layers set.
//
// Prints one JSON line: us_per_micro_step is the median over `repeats` timed
// blocks of `steps` optimizer steps each, after `warmup-steps` untimed steps.
// bench/py/mlp_microstep.py is the same loop in Python.
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bench_support.h"
#include "gradaccum/core/trainer.h"
#include "gradaccum/data/gather_rows.h"
#include "gradaccum/io/process_stats.h"
#include "gradaccum/kernels/custom_kernels.h"
#include "gradaccum/models/networks.h"
#include "gradaccum/models/tasks.h"
#include "gradaccum/run/process_setup.h"

namespace {

using gradaccum::bench::median;

namespace core = gradaccum::core;
namespace kernels = gradaccum::kernels;

// Samples held in memory: x [n, 16], y [n, 1].
class RandomRegression final : public core::Dataset {
 public:
  explicit RandomRegression(int64_t n) : x_(torch::randn({n, 16})), y_(torch::randn({n, 1})) {}
  int64_t size() const override { return x_.size(0); }
  core::Batch get(const torch::Tensor& indices, torch::ScalarType dtype) const override {
    core::Batch batch;
    // As the library's datasets gather (data/gather_rows.h); float32 already.
    batch.input = gradaccum::data::gather_rows(x_, indices).to(dtype);
    batch.target = gradaccum::data::gather_rows(y_, indices).to(dtype);
    batch.samples = indices.size(0);
    return batch;
  }

 private:
  torch::Tensor x_;
  torch::Tensor y_;
};

// Records when each optimizer step ended.
class StepClock final : public core::TrainingObserver {
 public:
  void on_step(const core::StepRecord& r) override {
    ends.push_back(std::chrono::steady_clock::now());
    micro_steps.push_back(r.micro_steps);
  }
  std::vector<std::chrono::steady_clock::time_point> ends;
  std::vector<int64_t> micro_steps;
};

int64_t flag(int argc, char** argv, const char* name, int64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::stoll(argv[i + 1]);
  }
  return fallback;
}

std::string string_flag(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

bool has_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return true;
  }
  return false;
}

// The loop without the engine: per micro-step fetch, forward, squared-error sum,
// backward of sum / window items; per window clip, AdamW step, release the
// gradients, cosine learning rate. Returns the end time of every step.
std::vector<std::chrono::steady_clock::time_point> raw_loop(const RandomRegression& data, torch::nn::Sequential& net,
                                                            int64_t total_steps, int64_t b, int64_t accumulation) {
  auto params = net->parameters();
  const double peak_lr = 1e-3;
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(peak_lr).weight_decay(0.0));
  auto generator = at::detail::createCPUGenerator(42);
  const auto perm = torch::randperm(data.size(), generator, torch::kLong);
  std::vector<std::chrono::steady_clock::time_point> ends;
  const int64_t window = b * accumulation;
  for (int64_t step = 0; step < total_steps; ++step) {
    for (int64_t s = 0; s < accumulation; ++s) {
      const auto batch = data.get(perm.slice(0, step * window + s * b, step * window + (s + 1) * b), torch::kFloat);
      auto loss = (net->forward(batch.input) - batch.target).square().sum();
      (loss / static_cast<double>(window)).backward();
    }
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    optimizer.step();
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    const double lr =
        peak_lr * 0.5 * (1.0 + std::cos(M_PI * static_cast<double>(step + 1) / static_cast<double>(total_steps)));
    for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
    ends.push_back(std::chrono::steady_clock::now());
  }
  return ends;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t threads = flag(argc, argv, "--threads", 1);
  const int64_t warmup = flag(argc, argv, "--warmup-steps", 20);
  const int64_t repeats = flag(argc, argv, "--repeats", 7);
  const int64_t steps = flag(argc, argv, "--steps", 50);
  constexpr int64_t kMicroBatch = 1;
  constexpr int64_t kAccumulation = 16;
  // The process as `gradaccum train` sets it up (run/process_setup.h).
  std::optional<gradaccum::run::ProcessSetup> setup;
  try {
    setup.emplace(gradaccum::run::ProcessSettings{.threads = threads,
                                                  .custom_kernels = string_flag(argc, argv, "--custom-kernels", "all"),
                                                  .retain_freed_heap = true});
  } catch (const gradaccum::Error& e) {
    fmt::print(stderr, "mlp_microstep: {}\n", e.what());
    return 2;
  }
  torch::manual_seed(42);
  // More samples than the run consumes: every window is full and no epoch ends.
  const int64_t total_steps = warmup + repeats * steps;
  RandomRegression data(total_steps * kMicroBatch * kAccumulation);
  const bool raw = has_flag(argc, argv, "--raw");
  const bool unfused = has_flag(argc, argv, "--unfused");
  StepClock clock;
  double final_loss = 0.0;  // the engine's last window loss (the raw loop reports none)
  auto start = std::chrono::steady_clock::now();
  if (raw) {
    auto net = gradaccum::models::seed000_sequential_mlp();
    clock.ends = raw_loop(data, net, total_steps, kMicroBatch, kAccumulation);
    clock.micro_steps.assign(clock.ends.size(), kAccumulation);
  } else {
    // The same weights either way: both draw their initialization in the same order.
    auto model = unfused ? gradaccum::models::Regressor(gradaccum::models::seed000_sequential_mlp())
                         : gradaccum::models::Regressor(gradaccum::models::seed000_mlp());
    const auto options = gradaccum::bench::adamw_trainer_options(kMicroBatch, kAccumulation, total_steps);
    core::Trainer trainer(options, model, data, nullptr, clock);
    start = std::chrono::steady_clock::now();
    final_loss = trainer.run().final_loss;
  }

  std::vector<double> us_per_micro_step;
  for (int64_t r = 0; r < repeats; ++r) {
    const int64_t first = warmup + r * steps;  // the block's steps are [first, first + steps)
    const auto block_start = first == 0 ? start : clock.ends[first - 1];
    const auto block_end = clock.ends[first + steps - 1];
    int64_t micro = 0;
    for (int64_t s = first; s < first + steps; ++s) micro += clock.micro_steps[s];
    us_per_micro_step.push_back(std::chrono::duration<double, std::micro>(block_end - block_start).count() /
                                static_cast<double>(micro));
  }
  fmt::print(
      "{{\"program\": \"{}\", \"custom_kernels\": \"{}\", \"threads\": {}, \"micro_batch\": {}, \"accum\": {}, "
      "\"warmup_steps\": {}, \"repeats\": {}, \"steps_per_repeat\": {}, "
      "\"us_per_micro_step\": {:.2f}, \"us_per_micro_step_min\": {:.2f}, \"repeats_us\": [{:.2f}], "
      "\"final_loss\": {}, \"peak_rss_mb\": {:.1f}}}\n",
      raw       ? "libtorch-raw"
      : unfused ? "gradaccum-unfused"
                : "gradaccum",
      kernels::custom_kernels_description(), threads, kMicroBatch, kAccumulation, warmup, repeats, steps,
      median(us_per_micro_step), *std::min_element(us_per_micro_step.begin(), us_per_micro_step.end()),
      fmt::join(us_per_micro_step, ", "), raw ? std::string("null") : fmt::format("{:.6f}", final_loss),
      gradaccum::io::peak_rss_mb());
  return 0;
}
