// run::ProcessSetup and run::fit: each run gets its own process settings (threads, the custom
// kernels, the stop signals), and the process is as before when it ends.
#include "gradaccum/run/process_setup.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <tuple>

#include "gradaccum/kernels/custom_kernels.h"
#include "gradaccum/run/fit.h"
#include "test_support.h"

namespace process_setup_test {

namespace core = gradaccum::core;
namespace kernels = gradaccum::kernels;
namespace run = gradaccum::run;

struct Squares : core::Trainable {
  core::LossSum loss(const core::Batch& batch) override {
    auto sum = (net->forward(batch.input) - batch.target).pow(2).sum();
    return {sum, torch::scalar_tensor(batch.target.numel(), torch::kLong)};
  }
  core::EvalSums evaluate(const core::Batch& batch) override {
    auto l = loss(batch);
    return {l.sum, l.count, torch::Tensor()};
  }
  torch::nn::Module& module() override { return *net; }
  torch::nn::Linear net{4, 1};
};

struct Points : core::Dataset {
  int64_t size() const override { return 64; }
  core::Batch get(const torch::Tensor& indices, torch::ScalarType dtype) const override {
    core::Batch batch;
    batch.input = x.index_select(0, indices).to(dtype);
    batch.target = batch.input.sum(1, true);
    batch.samples = indices.size(0);
    return batch;
  }
  torch::Tensor x = torch::randn({64, 4});
};

// The process as a run step sees it.
struct Seen {
  int threads = -1;
  std::string kernels;
  bool stop_handler = false;  // SIGTERM asks the run to stop rather than ending the process
};

Seen now() {
  struct sigaction action {};
  sigaction(SIGTERM, nullptr, &action);
  return {at::get_num_threads(), kernels::custom_kernels_description(), action.sa_handler != SIG_DFL};
}

struct Recorder : core::TrainingObserver {
  void on_step(const core::StepRecord& r) override {
    seen = now();
    ++steps;
    if (raise_stop_at == r.step) ::raise(SIGTERM);
  }
  Seen seen;
  int64_t steps = 0;
  int64_t raise_stop_at = -1;
};

run::RunOptions options_of(const std::string& output_dir, int64_t threads, const std::string& custom_kernels) {
  run::RunOptions options;
  options.output_dir = output_dir;
  options.threads = threads;
  options.custom_kernels = custom_kernels;
  options.console = false;
  options.trainer.per_device_train_batch_size = 4;
  options.trainer.global_batch_size = 8;
  options.trainer.max_steps = 2;
  options.trainer.eval_steps = 0;
  return options;
}

TEST(ProcessSetup, TwoFitsInOneProcessEachGetTheirOwnSettingsAndLeaveTheProcessAsItWas) {
  const auto dir = gradaccum::testing::make_temp_dir("process-setup-two-fits");
  const auto before = now();
  ASSERT_FALSE(before.stop_handler);
  Points data;
  for (const auto& [threads, kernels_spec, described] :
       {std::tuple{1, "none", "none"}, std::tuple{2, "gelu_tanh,qkv_attention", "qkv_attention, gelu_tanh"}}) {
    SCOPED_TRACE(kernels_spec);
    Squares model;
    Recorder recorder;
    // No set-up given: fit makes its own from the options.
    const auto result = run::fit(options_of(dir + "/" + std::to_string(threads), threads, kernels_spec), model, data,
                                 nullptr, {}, &recorder);
    EXPECT_EQ(result.summary.steps, 2);
    EXPECT_EQ(recorder.seen.threads, threads);
    EXPECT_EQ(recorder.seen.kernels, described);
    EXPECT_TRUE(recorder.seen.stop_handler);
    const auto after = now();
    EXPECT_EQ(after.threads, before.threads);
    EXPECT_EQ(after.kernels, before.kernels);
    EXPECT_FALSE(after.stop_handler);
  }
}

TEST(ProcessSetup, FitKeepsTheCallersSetupAsItIs) {
  const auto dir = gradaccum::testing::make_temp_dir("process-setup-callers");
  const auto before = now();
  Points data;
  Squares model;
  Recorder recorder;
  {
    const run::ProcessSetup process({.threads = 2, .custom_kernels = "group_norm"});
    EXPECT_EQ(process.threads(), 2);
    // The run's own keys say otherwise: the caller's set-up holds.
    run::fit(options_of(dir, 1, "none"), model, data, nullptr, {}, &recorder, &process,
             gradaccum::dist::DistEnvironment{});
    EXPECT_EQ(recorder.seen.threads, 2);
    EXPECT_EQ(recorder.seen.kernels, "group_norm");
    EXPECT_EQ(now().threads, 2);  // still the caller's until its set-up ends
    EXPECT_EQ(now().kernels, "group_norm");
  }
  EXPECT_EQ(now().threads, before.threads);
  EXPECT_EQ(now().kernels, before.kernels);
}

TEST(ProcessSetup, ABadKernelSpecChangesNothing) {
  const auto before = now();
  EXPECT_ONE_LINE_ERROR(run::ProcessSetup({.threads = 1, .custom_kernels = "gelu_tanh,fast"}),
                        "custom_kernels: unknown kernel 'fast'");
  EXPECT_EQ(now().threads, before.threads);
  EXPECT_EQ(now().kernels, before.kernels);
}

// A stop request ends the run it arrives in, not the next one in the same process.
TEST(ProcessSetup, AStopThatEndedOneRunDoesNotStopTheNext) {
  const auto dir = gradaccum::testing::make_temp_dir("process-setup-stop");
  Points data;
  Squares first_model, second_model;
  Recorder first, second;
  first.raise_stop_at = 1;
  auto options = options_of(dir + "/first", 1, "all");
  options.trainer.max_steps = 4;
  const auto stopped = run::fit(options, first_model, data, nullptr, {}, &first);
  EXPECT_TRUE(stopped.summary.preempted);
  EXPECT_EQ(first.steps, 1);
  options.output_dir = dir + "/second";
  const auto whole = run::fit(options, second_model, data, nullptr, {}, &second);
  EXPECT_FALSE(whole.summary.preempted);
  EXPECT_EQ(second.steps, 4);
}

// A training process keeps its freed heap (kernels/heap_retention.h) unless it shards the
// parameters: under ZeRO-3 the retained heap would keep what sharding gave back.
TEST(ProcessSetup, TrainingKeepsItsFreedHeapExceptUnderZeroStage3) {
  gradaccum::io::RunSettings settings;
  const core::TrainerOptions trainer;
  for (const int64_t stage : {0, 1, 2, 3}) {
    settings.zero_stage = stage;
    EXPECT_EQ(run::training_process_settings(settings, trainer, 2).retain_freed_heap, stage != 3) << stage;
  }
}

}  // namespace process_setup_test
