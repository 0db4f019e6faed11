// Shared fixtures of the test suite: in-memory datasets, gradient comparison,
// split accumulation through the engine's LossNormalizer, and running the CLI.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "gradaccum/base/check.h"
#include "gradaccum/core/loss_normalizer.h"
#include "gradaccum/core/trainable.h"
#include "gradaccum/core/trainer.h"
#include "gradaccum/kernels/custom_kernels.h"

namespace gradaccum::testing {

// Rows of (x, y) tensors as a dataset; x is cast to the requested dtype, y too
// when it is floating point.
class TensorDataset final : public core::Dataset {
 public:
  TensorDataset(torch::Tensor x, torch::Tensor y) : x_(std::move(x)), y_(std::move(y)) {}
  int64_t size() const override { return x_.size(0); }
  core::Batch get(const torch::Tensor& indices, torch::ScalarType dtype) const override {
    core::Batch b;
    b.input = x_.index_select(0, indices).to(dtype);
    b.target = y_.index_select(0, indices);
    if (b.target.is_floating_point()) b.target = b.target.to(dtype);
    b.samples = indices.size(0);
    return b;
  }

 private:
  torch::Tensor x_, y_;
};

// max |a - b| / max |b| over all elements (the DESIGN.md §1 measure).
inline double max_relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  const double scale = b.abs().max().item<double>();
  return (a - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

// f(x) and the gradient d(Σ f(x) ⊙ w)/dx for a fixed pseudo-random w: one
// backward that exercises every output, to compare two implementations of f.
struct ValueAndGrad {
  torch::Tensor value, grad;
};

template <typename F>
ValueAndGrad value_and_grad(F&& f, const torch::Tensor& x) {
  auto input = x.clone().requires_grad_(true);
  auto value = f(input);
  torch::manual_seed(9);
  const auto w = torch::randn(value.sizes()).to(value.scalar_type());
  (value * w).sum().backward();
  return {value.detach(), input.grad()};
}

// All parameters' gradients (or values) flattened into one float64 vector.
inline torch::Tensor flat_grads(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (auto& p : m.parameters()) {
    parts.push_back(p.grad().defined() ? p.grad().reshape(-1).to(torch::kDouble)
                                       : torch::zeros({p.numel()}, torch::kDouble));
  }
  return torch::cat(parts);
}
inline torch::Tensor flat_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (auto& p : m.parameters()) parts.push_back(p.detach().reshape(-1).to(torch::kDouble));
  return torch::cat(parts);
}

// Every parameter's .grad (undefined where it has none), as LossNormalizer::finish takes them.
inline std::vector<torch::Tensor> parameter_grads(torch::nn::Module& m) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : m.parameters()) grads.push_back(p.grad());
  return grads;
}

inline void zero_grads(torch::nn::Module& m) {
  for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
}

// Accumulates one window over consecutive row ranges of sizes `splits` the way
// the Trainer does (objective → backward per micro-batch, then finish), and
// returns the window loss. `accumulation_steps` is the configured N the naive
// mode divides by.
inline double accumulate_window(core::Trainable& model, const torch::Tensor& x, const torch::Tensor& y,
                                const std::vector<int64_t>& splits, core::LossNormalization mode,
                                int64_t accumulation_steps) {
  zero_grads(model.module());
  core::LossNormalizer normalizer(mode, accumulation_steps);
  normalizer.begin_window();
  int64_t begin = 0;
  for (auto n : splits) {
    core::Batch batch{x.slice(0, begin, begin + n), y.slice(0, begin, begin + n), {}, n};
    normalizer.objective(model.loss(batch)).backward();
    begin += n;
  }
  auto result = normalizer.finish(normalizer.local_totals(), parameter_grads(model.module()), 1);
  return result.loss.item<double>();
}

// The message of the gradaccum::Error that `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const gradaccum::Error& e) {
    return e.what();
  }
  return "";
}

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the gradaccum program with `args` (shell-quoted by the caller) in `cwd`, after the shell
// command `before` (e.g. "ulimit -v 600000") when given.
CliResult run_cli(const std::string& args, const std::string& cwd = "", const std::string& before = "");

// A fresh empty directory under the system temp dir, removed when the test process exits
// (kept with GRADACCUM_KEEP_TEST_DIRS=1).
std::string make_temp_dir(const std::string& name);

// The output of a slow reference (a Python script that runs transformers, PEFT or gguf), made
// once per build tree and read by every test process that asks for it: ctest runs each test in
// a process of its own, and several tests read one reference. `command(dir)` is a shell command
// that writes into `dir`; the reference is keyed by `name`, the command and the bytes of `inputs`
// (the scripts it runs), so an edited script runs again. Concurrent processes wait for the one
// that makes it (flock). A failed command is not kept: `error` holds its log's last 2000 bytes.
// The directory is shared: tests read it and write elsewhere.
struct SharedReference {
  std::string dir, error;
};
SharedReference shared_reference(const std::string& name, const std::vector<std::string>& inputs,
                                 const std::function<std::string(const std::string& dir)>& command);

// A program of the project's Python venv (scripts/setup.sh): $GRADACCUM_VENV/bin/<name>,
// /opt/gradaccum/venv/bin/<name> when the variable is unset or empty.
std::string venv_program(const std::string& name);

// The GPT-2 vocabulary's directory (gpt2.tiktoken, from scripts/setup.sh): $GRADACCUM_TOKENIZER_DIR,
// data::kDefaultTokenizerDir when the variable is unset or empty.
std::string gpt2_tokenizer_dir();

// The lines of a file's bytes as the reference scripts split them: the bytes between '\n', a
// final '\n' ending the last line.
std::vector<std::string> split_lines(const std::string& bytes);

std::string read_text(const std::string& path);

// The JSON objects of a JSON-lines file (metrics.jsonl), in order.
std::vector<nlohmann::json> read_jsonl(const std::string& path);

// The optimizer-step records of a metrics.jsonl (the lines with a "loss").
std::vector<nlohmann::json> step_records(const std::string& metrics_path);

// Runs `gradaccum train ARGS --set output_dir=OUT`, expects exit code 0, and
// returns the run's step records.
std::vector<nlohmann::json> train_steps(const std::string& args, const std::string& out);

// The pid of the child of `launcher` (a `gradaccum train --nproc` process)
// whose environment says RANK=`rank`, or -1.
int rank_pid(int launcher, int rank);

// |a - b| / |b| (b = 0 counts as a tiny number, so a difference still shows).
inline double relative_difference(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

// How many nodes of the autograd graph behind `t` have each name, unqualified
// (CheckpointFunction matches gradaccum::models::(anonymous namespace)::CheckpointFunction) or
// as a prefix (ScaledDotProduct matches ScaledDotProductFlashAttentionForCpuBackward0).
std::vector<int> count_autograd_nodes(const torch::Tensor& t, const std::vector<std::string>& names);

// Sets the process-wide custom kernel switch (kernels/custom_kernels.h) to `spec` for its
// lifetime and restores the previous setting after.
class CustomKernelsScope {
 public:
  explicit CustomKernelsScope(const std::string& spec) : previous_(kernels::custom_kernels_description()) {
    kernels::set_custom_kernels(spec);
  }
  ~CustomKernelsScope() { kernels::set_custom_kernels(previous_); }
  CustomKernelsScope(const CustomKernelsScope&) = delete;
  CustomKernelsScope& operator=(const CustomKernelsScope&) = delete;

 private:
  std::string previous_;
};

// Per-step loss and grad norm, and the final weights (on the CPU), of one training run.
struct Trajectory {
  std::vector<double> loss, grad_norm;
  torch::Tensor weights;
  int64_t allreduce_calls = 0;  // of the last window, when trained through a process group
  int64_t buckets = 0;          // the gradient buckets of that group's sync
};

// The options seed 000's MLP trains with here: b × n for `steps` optimizer steps in float64, AdamW
// at lr 1e-2, clipping at 0.5 (so the first steps are clipped).
core::TrainerOptions seed000_options(int64_t b, int64_t n, int64_t steps);

// Seed 000's MLP (16 → 32 → GELU → 1) trained by core::Trainer in float64 on `device` with
// b × n on `samples` fixed random samples for `steps` optimizer steps (AdamW, lr 1e-2, 2 warm-up
// steps, clipping at 0.5 so the first steps are clipped). The same data and initial weights for
// every decomposition and device.
// With `group`, gradients go through a dist::BucketedGradSync over it, in buckets of
// `bucket_bytes`.
Trajectory train_seed000_mlp(int64_t b, int64_t n, int64_t samples, int64_t steps,
                             const torch::Device& device = torch::kCPU,
                             const c10::intrusive_ptr<c10d::Backend>& group = {}, int64_t bucket_bytes = 25 << 20);

}  // namespace gradaccum::testing

// `expr` throws a gradaccum::Error whose one-line message contains `needle`.
#define EXPECT_ONE_LINE_ERROR(expr, needle)                                            \
  do {                                                                                 \
    const std::string message = ::gradaccum::testing::error_of([&] { (void)(expr); }); \
    EXPECT_NE(message.find(needle), std::string::npos) << message;                     \
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;                       \
  } while (false)
