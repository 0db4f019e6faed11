// window_tokens (core/window_plan.h): windows closed by a token count instead of a sample count.
// The boundaries follow the documented rule (hand-computed below), do not depend on b or W, runs
// of b = 1, b = 4 and two ranks agree in float64, the LR schedule counts the windows, and a run
// stopped inside a window — with token windows, with a token budget per micro-batch, or both —
// continues bit-identically.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "gradaccum/core/saved_geometry.h"
#include "gradaccum/core/trainer.h"
#include "gradaccum/core/window_plan.h"
#include "gradaccum/data/lm_dataset.h"
#include "gradaccum/dist/bucketed_grad_sync.h"
#include "gradaccum/formats/safetensors.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/models/module_tensors.h"
#include "gradaccum/optim/optimizer_state.h"
#include "in_process_ranks.h"
#include "stop_inside_window.h"
#include "test_support.h"
#include "tiny_decoders.h"

namespace window_tokens_test {

namespace core = gradaccum::core;
namespace data = gradaccum::data;
namespace models = gradaccum::models;
namespace support = gradaccum::testing;
using core::BatchGeometry;
using core::LastWindow;
using core::SampleOrder;
using core::WindowPlan;
using support::run_cli;
using support::step_records;

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  const auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

const auto kItems = torch::tensor({5, 3, 4, 2, 6, 1, 1, 7}, torch::kLong);

WindowPlan sequential_plan(int64_t tokens, LastWindow last = LastWindow::partial,
                           BatchGeometry geometry = BatchGeometry::from_accumulation(2, 1)) {
  WindowPlan plan(8, geometry, last, 1, SampleOrder::sequential);
  plan.set_window_tokens(tokens, kItems);
  return plan;
}

TEST(WindowTokens, AWindowClosesWhereItsItemsFirstReachT) {
  // T = 8: 5 + 3 = 8 closes {0, 1}; 4 + 2 + 6 = 12 closes {2, 3, 4}; 1 + 1 + 7 = 9 closes {5, 6, 7}.
  const auto eight = sequential_plan(8);
  const auto order = eight.permutation(0);
  ASSERT_EQ(eight.windows_in_epoch(0), 3);
  EXPECT_EQ(to_vector(eight.window(order, 0, 0).samples()), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(to_vector(eight.window(order, 0, 1).samples()), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(to_vector(eight.window(order, 0, 2).samples()), (std::vector<int64_t>{5, 6, 7}));
  // Cut into micro-batches of b = 2: {2, 3, 4} takes two micro-steps, [2, 3] and [4].
  const auto middle = eight.window(order, 0, 1);
  EXPECT_EQ(middle.micro_steps(), 2);
  EXPECT_EQ(to_vector(middle.micro_batch(1)), (std::vector<int64_t>{4}));
  // T = 10: 5 + 3 + 4 = 12 closes {0, 1, 2}; 2 + 6 + 1 + 1 = 10 closes {3, 4, 5, 6}; {7} holds
  // 7 < 10 tokens: the epoch's partial last window, or dropped.
  const auto ten = sequential_plan(10);
  ASSERT_EQ(ten.windows_in_epoch(0), 3);
  EXPECT_EQ(to_vector(ten.window(order, 0, 1).samples()), (std::vector<int64_t>{3, 4, 5, 6}));
  EXPECT_EQ(to_vector(ten.window(order, 0, 2).samples()), (std::vector<int64_t>{7}));
  EXPECT_EQ(sequential_plan(10, LastWindow::drop).windows_in_epoch(0), 2);
  EXPECT_EQ(ten.windows_in_epochs(3), 9);  // the same windows in every epoch of a fixed order
  // One sample over T is a window of its own: T = 1 gives one window per sample.
  EXPECT_EQ(sequential_plan(1).windows_in_epoch(0), 8);
  // Two ranks of b = 1: chunks [3], [4], [5], [6] go to rank 0, 1, 0, 1.
  const auto ranks = sequential_plan(10, LastWindow::partial, BatchGeometry::from_accumulation(1, 1, 2));
  const auto shared = ranks.window(order, 0, 1);
  EXPECT_EQ(shared.micro_steps(), 2);
  EXPECT_EQ(to_vector(shared.micro_batch(1, 0)), (std::vector<int64_t>{5}));
  EXPECT_EQ(to_vector(shared.micro_batch(1, 1)), (std::vector<int64_t>{6}));
}

TEST(WindowTokens, WindowsDependOnTheEpochButNotOnTheDecomposition) {
  const auto items = torch::randint(1, 40, {300}, at::detail::createCPUGenerator(3), torch::kLong);
  auto make = [&](BatchGeometry g) {
    WindowPlan plan(300, g, LastWindow::partial, 7);
    plan.set_window_tokens(200, items);
    return plan;
  };
  const auto one = make(BatchGeometry::from_accumulation(1, 1));
  const auto split = make(BatchGeometry::from_accumulation(4, 1, 2));
  int64_t total = 0;
  for (int64_t e = 0; e < 3; ++e) {
    const auto order = one.permutation(e);
    ASSERT_EQ(one.windows_in_epoch(e), split.windows_in_epoch(e)) << e;
    std::vector<int64_t> seen;
    for (int64_t k = 0; k < one.windows_in_epoch(e); ++k) {
      const auto w = one.window(order, e, k);
      EXPECT_TRUE(torch::equal(w.samples(), split.window(order, e, k).samples())) << e << " " << k;
      const int64_t tokens = items.index_select(0, w.samples()).sum().item<int64_t>();
      const int64_t last = items[w.samples()[-1].item<int64_t>()].item<int64_t>();
      // Each window reaches T only with its last sample (the epoch's last window may fall short).
      if (k + 1 < one.windows_in_epoch(e)) EXPECT_GE(tokens, 200) << e << " " << k;
      EXPECT_LT(tokens - last, 200) << e << " " << k;
      const auto s = to_vector(w.samples());
      seen.insert(seen.end(), s.begin(), s.end());
    }
    EXPECT_EQ(seen, to_vector(order)) << "epoch " << e << " uses every sample once, in order";
    total += one.windows_in_epoch(e);
  }
  EXPECT_EQ(one.windows_in_epochs(3), total);
  // The permutations differ, and with them the boundaries.
  EXPECT_FALSE(
      torch::equal(one.window(one.permutation(0), 0, 0).samples(), one.window(one.permutation(1), 1, 0).samples()));
}

TEST(WindowTokens, RefusesWhatCannotHold) {
  WindowPlan carry(8, BatchGeometry::from_accumulation(2, 1), LastWindow::carry, 1);
  EXPECT_EQ(support::error_of([&] { carry.set_window_tokens(8, kItems); }),
            "WindowPlan: windows of tokens need a plan that neither carries nor orders chunks contiguously");
  WindowPlan images(8, BatchGeometry::from_accumulation(2, 1), LastWindow::partial, 1);
  EXPECT_EQ(support::error_of([&] { images.set_window_tokens(8, torch::Tensor()); }),
            "key 'window_tokens': this dataset's samples have no token count (windows of tokens need a causal "
            "language model's data)");
  WindowPlan few(8, BatchGeometry::from_accumulation(2, 1), LastWindow::drop, 1);
  EXPECT_EQ(support::error_of([&] { few.set_window_tokens(30, kItems); }),
            "key 'window_tokens': the training data holds 29 tokens to predict, fewer than one window of 30 with "
            "last_window: drop");
}

// Documents of 2 .. 13 tokens (ids in [1, 64)): uneven targets per sample.
data::CausalLmDataset lm_data() {
  auto generator = at::detail::createCPUGenerator(77);
  std::vector<std::vector<data::TokenId>> docs;
  for (int64_t i = 0; i < 48; ++i) {
    const auto ids = torch::randint(1, 64, {2 + (i * 5) % 12}, generator, torch::kLong);
    docs.emplace_back(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  }
  data::LmDatasetOptions o;
  o.max_length = 16;
  o.pad_token_id = 0;
  return data::CausalLmDataset(docs, o);
}

// lm_data() has Σ (length - 1) = 4 × (12 + 66) = 312 targets: about 8 windows of 40 per epoch.
constexpr int64_t kWindowTokens = 40;

core::TrainerOptions options(int64_t b, int64_t window_tokens, int64_t budget) {
  core::TrainerOptions o;
  o.per_device_train_batch_size = b;
  o.gradient_accumulation_steps = 3;  // unused by token windows
  o.window_tokens = window_tokens;
  o.max_tokens_per_micro_batch = budget;
  o.num_train_epochs = 2;
  o.optimizer.learning_rate = 1e-2;
  o.lr_scheduler_type = gradaccum::optim::ScheduleType::linear;
  o.max_grad_norm = 0.5;
  o.dtype = torch::kDouble;
  return o;
}

struct TrainedRun {
  std::vector<double> loss, grad_norm, lr;
  std::vector<int64_t> items, micro_steps, samples, epoch;
  torch::Tensor weights;
  int64_t total_steps = 0;
};

struct Collect final : core::TrainingObserver {
  void on_step(const core::StepRecord& r) override {
    run.loss.push_back(r.loss);
    run.grad_norm.push_back(r.grad_norm);
    run.lr.push_back(r.lr);
    run.items.push_back(r.items);
    run.micro_steps.push_back(r.micro_steps);
    run.samples.push_back(r.samples);
    run.epoch.push_back(r.epoch);
  }
  TrainedRun run;
};

TrainedRun train(const core::TrainerOptions& o, const c10::intrusive_ptr<c10d::Backend>& group = {}) {
  const auto data = lm_data();
  models::CausalLm model{models::Gpt2LmHeadModel(support::tiny_gpt2_config(1))};
  Collect collect;
  std::unique_ptr<gradaccum::dist::BucketedGradSync> sync;
  if (group) {
    model.module().to(torch::kCPU, torch::kDouble);
    sync = std::make_unique<gradaccum::dist::BucketedGradSync>(group, model.module().parameters(),
                                                               gradaccum::dist::GradSyncOptions{});
  }
  core::Trainer trainer(o, model, data, nullptr, collect, sync.get());
  trainer.run();
  collect.run.weights = support::flat_params(model.module());
  collect.run.total_steps = trainer.total_steps();
  return collect.run;
}

void expect_same_trajectory(const TrainedRun& a, const TrainedRun& b) {
  ASSERT_EQ(a.loss.size(), b.loss.size());
  for (size_t i = 0; i < a.loss.size(); ++i) {
    EXPECT_NEAR(a.loss[i], b.loss[i], 1e-10 * std::abs(b.loss[i])) << i;
    EXPECT_NEAR(a.grad_norm[i], b.grad_norm[i], 1e-10 * std::abs(b.grad_norm[i])) << i;
    EXPECT_EQ(a.items[i], b.items[i]) << i;
    EXPECT_EQ(a.samples[i], b.samples[i]) << i;
  }
  EXPECT_LE((a.weights - b.weights).abs().max().item<double>(), 1e-10 * b.weights.abs().max().item<double>());
}

TEST(WindowTokensRuns, OneSampleFourSamplesAndTwoRanksTrainAlike) {
  const auto one = train(options(1, kWindowTokens, 0));
  const auto four = train(options(4, kWindowTokens, 0));
  std::vector<TrainedRun> ranks(2);
  support::run_on_ranks(2, [&](const c10::intrusive_ptr<c10d::Backend>& group, int rank) {
    ranks[static_cast<size_t>(rank)] = train(options(2, kWindowTokens, 0), group);
  });
  expect_same_trajectory(four, one);
  expect_same_trajectory(ranks[0], one);
  expect_same_trajectory(ranks[1], one);

  // The schedule counts the windows: as many steps as windows in both epochs, and the linear
  // decay's last step runs at lr / total.
  WindowPlan plan(lm_data().size(), BatchGeometry::from_accumulation(1, 1), LastWindow::partial, 42);
  plan.set_window_tokens(kWindowTokens, lm_data().sample_items());
  ASSERT_EQ(one.total_steps, plan.windows_in_epochs(2));
  ASSERT_EQ(static_cast<int64_t>(one.loss.size()), one.total_steps);
  EXPECT_NEAR(one.lr.back(), 1e-2 / static_cast<double>(one.total_steps), 1e-15);
  // Each window's normalizer is its own token count: ≥ 40 but for each epoch's last, and all of
  // an epoch's windows together hold its 312 targets.
  int64_t epoch_items[2] = {0, 0};
  for (size_t i = 0; i < one.items.size(); ++i) {
    const bool epoch_end = i + 1 == one.items.size() || one.epoch[i + 1] != one.epoch[i];
    if (!epoch_end) EXPECT_GE(one.items[i], kWindowTokens) << i;
    epoch_items[one.epoch[i]] += one.items[i];
    // b = 1: one micro-step per sample; b = 4: ceil(samples / 4).
    EXPECT_EQ(one.micro_steps[i], one.samples[i]) << i;
    EXPECT_EQ(four.micro_steps[i], (one.samples[i] + 3) / 4) << i;
  }
  EXPECT_EQ(epoch_items[0], 312);
  EXPECT_EQ(epoch_items[1], 312);

  // A token budget per micro-batch inside token windows changes the micro-steps, not the result.
  const auto budget = train(options(4, kWindowTokens, 24));
  expect_same_trajectory(budget, one);
}

using gradaccum::testing::MemoryHook;
using gradaccum::testing::StopAfterFetches;

// Stops inside the first window from step 3 on that has at least two micro-steps (the stop
// flag is raised while its first micro-batch is fetched), restores a fresh trainer from what was
// saved, and expects the final weights of the uninterrupted run, bit for bit.
void expect_exact_resume_inside_a_window(const core::TrainerOptions& o) {
  const auto data = lm_data();
  core::ObserverList quiet;
  models::CausalLm straight_model{models::Gpt2LmHeadModel(support::tiny_gpt2_config(1))};
  Collect collect;
  core::Trainer straight(o, straight_model, data, nullptr, collect);
  straight.run();
  int64_t fetches = 0;
  size_t step = 2;
  for (size_t i = 0; i < step; ++i) fetches += collect.run.micro_steps[i];
  for (; collect.run.micro_steps.at(step) < 2; ++step) fetches += collect.run.micro_steps[step];
  fetches += 1;

  std::atomic<bool> stop{false};
  StopAfterFetches stopping(data, stop, fetches);
  models::CausalLm first_model{models::Gpt2LmHeadModel(support::tiny_gpt2_config(1))};
  core::Trainer first(o, first_model, stopping, nullptr, quiet);
  MemoryHook hook;
  hook.optimizer_ = &first.optimizer();
  hook.names_ = first.named_parameters();
  hook.module_ = &first_model.module();
  first.set_checkpointing(&hook, &stop);
  ASSERT_TRUE(first.run().preempted);
  EXPECT_EQ(hook.saved.position.micro_step, 1);
  EXPECT_EQ(hook.saved.position.step, static_cast<int64_t>(step));
  EXPECT_EQ(core::SavedGeometry::restore(hook.saved).window_tokens, o.window_tokens);

  models::CausalLm second_model{models::Gpt2LmHeadModel(support::tiny_gpt2_config(1))};
  core::Trainer second(o, second_model, data, nullptr, quiet);
  models::load_module_tensors(second_model.module(), hook.weights, "memory");
  gradaccum::optim::load_optimizer_state(second.optimizer(), second.named_parameters(),
                                         gradaccum::formats::parse_safetensors(hook.optimizer, "memory"), "memory");
  second.restore(hook.saved);
  const auto summary = second.run();
  EXPECT_EQ(summary.steps, straight.total_steps());
  EXPECT_TRUE(torch::equal(support::flat_params(second_model.module()), support::flat_params(straight_model.module())));
}

TEST(WindowTokensRuns, AStopInsideAWindowResumesBitIdentically) {
  expect_exact_resume_inside_a_window(options(2, kWindowTokens, 0));
  // A token budget of 24 padded tokens per micro-batch, windows of 12 samples (the plain count).
  auto budget = options(4, 0, 24);
  budget.gradient_accumulation_steps = 3;
  expect_exact_resume_inside_a_window(budget);
  // Both.
  expect_exact_resume_inside_a_window(options(4, kWindowTokens, 24));
}

TEST(WindowTokensRuns, ACheckpointOfOtherWindowsIsRefused) {
  const auto data = lm_data();
  core::ObserverList quiet;
  models::CausalLm model{models::Gpt2LmHeadModel(support::tiny_gpt2_config(1))};
  core::Trainer trainer(options(2, kWindowTokens, 0), model, data, nullptr, quiet);
  core::TrainingState state;
  core::SavedGeometry{trainer.plan().geometry(), 0}.save(state);
  EXPECT_EQ(support::error_of([&] { trainer.restore(state); }),
            "checkpoint: it was saved with window_tokens 0 and this run has 40");
  auto naive = options(2, kWindowTokens, 0);
  naive.loss_normalization = core::LossNormalization::micro_batch;
  EXPECT_EQ(support::error_of([&] { core::Trainer t(naive, model, data, nullptr, quiet); }),
            "option 'window_tokens': needs loss_normalization window or sum, not micro_batch (N varies per window)");
}

// The program: KJV verses on a tiny GPT-2, windows of 150 targets.
const std::string kTokens =
    "train --set model.type=gpt2 --set model.n_layer=1 --set model.n_embd=16 --set model.n_head=2 "
    "--set model.n_positions=32 --set data.type=kjv --set data.max_length=16 --set data.train_limit=120 "
    "--set data.eval_limit=-1 --set threads=1 --set learning_rate=1e-2 --set dtype=float64 --set window_tokens=150 "
    "--set grad_flow_steps=0";

TEST(WindowTokensCli, ARunCountsItsWindowsAndResumesWithAnotherMicroBatch) {
  const auto dir = support::make_temp_dir("window-tokens");
  const auto whole =
      run_cli(kTokens + " --set per_device_train_batch_size=4 --set save_steps=3 --set output_dir=" + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const auto a = step_records(dir + "/whole/metrics.jsonl");
  ASSERT_GE(a.size(), 5u);
  int64_t items = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool epoch_end = i + 1 == a.size() || a[i + 1]["epoch"] != a[i]["epoch"];
    if (!epoch_end) EXPECT_GE(a[i]["items"].get<int64_t>(), 150) << i;
    EXPECT_EQ(a[i]["gradient_accumulation_steps"], a[i]["micro_steps"]) << i;
    EXPECT_EQ(a[i]["micro_steps"].get<int64_t>(), (a[i]["samples"].get<int64_t>() + 3) / 4) << i;
    items += a[i]["items"].get<int64_t>();
  }
  // Each epoch's windows hold every training target once: the plain run over the same epochs
  // (windows of 8 verses) counts the same.
  const auto plain = run_cli(kTokens +
                             " --set window_tokens=0 --set per_device_train_batch_size=8 "
                             "--set gradient_accumulation_steps=1 --set output_dir=" +
                             dir + "/plain");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  int64_t plain_items = 0;
  for (const auto& r : step_records(dir + "/plain/metrics.jsonl")) plain_items += r["items"].get<int64_t>();
  EXPECT_EQ(items, plain_items);
  // Between windows any micro-batch continues: from step 3 at b = 1, the same trajectory.
  const auto resumed = run_cli(kTokens + " --set per_device_train_batch_size=1 --set output_dir=" + dir +
                               "/resumed --set resume_from_checkpoint=" + dir + "/whole/checkpoints/step-3");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto b = step_records(dir + "/resumed/metrics.jsonl");
  ASSERT_EQ(b.size(), a.size() - 3);
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_NEAR(b[i]["loss"].get<double>(), a[i + 3]["loss"].get<double>(), 1e-10 * a[i + 3]["loss"].get<double>());
    EXPECT_EQ(b[i]["items"], a[i + 3]["items"]);
    EXPECT_EQ(b[i]["micro_steps"], b[i]["samples"]);
  }
  // Another T changes the windows: refused.
  const auto other = run_cli(kTokens + " --set window_tokens=100 --set output_dir=" + dir +
                             "/other --set resume_from_checkpoint=" + dir + "/whole/checkpoints/step-3");
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_EQ(other.err, "gradaccum: error: checkpoint " + dir +
                           "/whole/checkpoints/step-3: it was saved with window_tokens 150 and this run has 100; that "
                           "changes the windows\n");
}

// Windows closed by a token count under ZeRO-3 at W = 2: N varies per window and a rank may have
// no samples in a window's last micro-step (it replays its peer's gathers and reductions); both
// policies follow one process in float64, window for window.
TEST(WindowTokensCli, ZeroStage3RanksFollowOneProcessFloat64) {
  const auto dir = support::make_temp_dir("window-tokens-zero3");
  const auto run = kTokens + " --set model.n_layer=2 --set per_device_train_batch_size=4";
  ASSERT_EQ(run_cli(run + " --set output_dir=" + dir + "/one").exit_code, 0);
  const auto one = step_records(dir + "/one/metrics.jsonl");
  ASSERT_GE(one.size(), 10u);
  for (const std::string policy : {"defer", "each_micro_step"}) {
    const auto r = run_cli(run + " --nproc 2 --set zero_stage=3 --set sharded_grad_sync=" + policy +
                           " --set output_dir=" + dir + "/" + policy);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto sharded = step_records(dir + "/" + policy + "/metrics.jsonl");
    ASSERT_EQ(sharded.size(), one.size()) << policy;
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_EQ(sharded[i]["items"], one[i]["items"]) << policy << " " << i;
      EXPECT_NEAR(sharded[i]["loss"].get<double>(), one[i]["loss"].get<double>(), 1e-10 * one[i]["loss"].get<double>())
          << policy << " " << i;
      EXPECT_NEAR(sharded[i]["grad_norm"].get<double>(), one[i]["grad_norm"].get<double>(),
                  1e-10 * one[i]["grad_norm"].get<double>())
          << policy << " " << i;
      EXPECT_EQ(sharded[i]["sharded_grad_sync"], policy);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(WindowTokensCli, WhatCannotBeCombinedIsNamed) {
  const auto global = run_cli(kTokens + " --set global_batch_size=32");
  EXPECT_EQ(global.exit_code, 1);
  EXPECT_EQ(global.err,
            "gradaccum: error: key 'window_tokens': cannot be combined with global_batch_size (the windows "
            "are measured in tokens)\n");
  const auto carry = run_cli(kTokens + " --set last_window=carry");
  EXPECT_EQ(carry.exit_code, 1);
  EXPECT_EQ(carry.err, "gradaccum: error: key 'window_tokens': cannot be combined with last_window: carry\n");
  const auto images = run_cli("train --set model.type=cnn --set data.train_limit=64 --set window_tokens=100");
  EXPECT_EQ(images.exit_code, 1);
  EXPECT_EQ(images.err,
            "gradaccum: error: key 'window_tokens': this dataset's samples have no token count (windows "
            "of tokens need a causal language model's data)\n");
}

}  // namespace window_tokens_test
