// last_window: carry (core/window_plan.h): windows cut from the epochs' permutations laid end to
// end. Every epoch uses every sample exactly once, every window but the run's last holds B
// samples, the windows do not depend on b, N or W, runs of several decompositions agree in
// float64, and a resume at a window that straddles an epoch boundary continues bit-identically.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "gradaccum/core/window_plan.h"
#include "test_support.h"

namespace carry_test {

using gradaccum::core::BatchGeometry;
using gradaccum::core::LastWindow;
using gradaccum::core::WindowPlan;
using gradaccum::testing::make_temp_dir;
using gradaccum::testing::read_jsonl;
using gradaccum::testing::run_cli;

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  const auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TEST(CarryWindows, EveryEpochUsesEverySampleOnceAndWindowsHoldB) {
  // n = 100, B = 32, 3 epochs: 300 samples in ceil(300 / 32) = 10 windows, 9 of 32 and one of 12.
  const WindowPlan plan(100, BatchGeometry::from_accumulation(8, 4), LastWindow::carry, 5);
  ASSERT_EQ(plan.windows_in_epochs(3), 10);
  std::vector<int64_t> stream;
  for (int64_t g = 0; g < 10; ++g) {
    const auto w = plan.carried_window(g, 3);
    EXPECT_EQ(w.size(), g < 9 ? 32 : 12) << g;
    EXPECT_EQ(w.epoch(), g * 32 / 100) << g;
    EXPECT_EQ(w.index(), g);
    const auto samples = to_vector(w.samples());
    stream.insert(stream.end(), samples.begin(), samples.end());
  }
  ASSERT_EQ(stream.size(), 300u);
  for (int64_t e = 0; e < 3; ++e) {
    // The epoch's stretch of the stream is its permutation: each sample once.
    std::vector<int64_t> epoch(stream.begin() + e * 100, stream.begin() + (e + 1) * 100);
    EXPECT_EQ(epoch, to_vector(plan.permutation(e))) << e;
    std::sort(epoch.begin(), epoch.end());
    for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(epoch[static_cast<size_t>(i)], i) << "epoch " << e;
  }
  // Window 3 = stream [96, 128): epoch 0's last four samples, then epoch 1's first 28.
  const auto straddling = to_vector(plan.carried_window(3, 3).samples());
  const auto first = to_vector(plan.permutation(0)), second = to_vector(plan.permutation(1));
  EXPECT_TRUE(std::equal(first.begin() + 96, first.end(), straddling.begin()));
  EXPECT_TRUE(std::equal(second.begin(), second.begin() + 28, straddling.begin() + 4));
  EXPECT_THROW(plan.carried_window(10, 3), gradaccum::Error);
  // Bounded by max_steps instead of epochs, the stream goes on: window 9 is full.
  EXPECT_EQ(plan.carried_window(9, 0).size(), 32);
}

TEST(CarryWindows, WindowsDoNotDependOnTheDecomposition) {
  const WindowPlan a(100, BatchGeometry::from_accumulation(32, 1), LastWindow::carry, 5);
  const WindowPlan b(100, BatchGeometry::from_accumulation(4, 4, 2), LastWindow::carry, 5);
  for (int64_t g = 0; g < 10; ++g) {
    EXPECT_TRUE(torch::equal(a.carried_window(g, 3).samples(), b.carried_window(g, 3).samples())) << g;
  }
  // A global batch larger than the dataset spans several epochs per window.
  const WindowPlan big(10, BatchGeometry::from_accumulation(8, 3), LastWindow::carry, 5);
  EXPECT_EQ(big.windows_in_epochs(4), 2);  // 40 samples: 24 + 16
  EXPECT_EQ(big.carried_window(1, 4).size(), 16);
  EXPECT_EQ(big.carried_window(1, 4).epoch(), 2);
}

const std::string kCarry =
    "train --set model.type=cnn --set model.channels=[4,8] --set model.hidden=[16] --set dtype=float64 "
    "--set data.train_limit=100 --set data.eval_limit=0 --set threads=1 --set num_train_epochs=2 "
    "--set last_window=carry --set grad_flow_steps=0 --set global_batch_size=32";

std::vector<nlohmann::json> steps_of(const std::string& dir) {
  return gradaccum::testing::step_records(dir + "/metrics.jsonl");
}

TEST(CarryRuns, DecompositionsAgreeAndEpochsAreCarried) {
  const auto dir = make_temp_dir("carry");
  const auto whole = run_cli(kCarry + " --set per_device_train_batch_size=32 --set output_dir=" + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const auto split =
      run_cli(kCarry + " --set per_device_train_batch_size=8 --nproc 2 --set output_dir=" + dir + "/split");
  ASSERT_EQ(split.exit_code, 0) << split.err;
  const auto a = steps_of(dir + "/whole"), b = steps_of(dir + "/split");
  // 200 samples over two epochs: ceil(200 / 32) = 7 steps, six of 32 and a last of 8.
  ASSERT_EQ(a.size(), 7u);
  ASSERT_EQ(b.size(), 7u);
  int64_t samples = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["samples"].get<int64_t>(), i < 6 ? 32 : 8) << i;
    EXPECT_EQ(a[i]["epoch"].get<int64_t>(), static_cast<int64_t>(i) * 32 / 100) << i;
    samples += a[i]["samples"].get<int64_t>();
    EXPECT_NEAR(b[i]["loss"].get<double>(), a[i]["loss"].get<double>(), 1e-10 * a[i]["loss"].get<double>()) << i;
    EXPECT_NEAR(b[i]["grad_norm"].get<double>(), a[i]["grad_norm"].get<double>(),
                1e-10 * a[i]["grad_norm"].get<double>())
        << i;
  }
  EXPECT_EQ(samples, 200);
  // With partial, the same epochs take 2 × 4 steps (three of 32 and one of 4 per epoch).
  const auto partial = run_cli(kCarry +
                               " --set last_window=partial --set per_device_train_batch_size=32 "
                               "--set output_dir=" +
                               dir + "/partial");
  ASSERT_EQ(partial.exit_code, 0) << partial.err;
  EXPECT_EQ(steps_of(dir + "/partial").size(), 8u);
}

TEST(CarryRuns, AResumeAtAWindowAcrossTheEpochBoundaryIsBitIdentical) {
  const auto dir = make_temp_dir("carry-resume");
  const std::string run = kCarry + " --set per_device_train_batch_size=8";
  const auto whole = run_cli(run + " --set save_steps=3 --set output_dir=" + dir + "/whole");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  // Step 4's window is stream [96, 128): it straddles epochs 0 and 1.
  const auto resumed = run_cli(run + " --set output_dir=" + dir + "/resumed --set resume_from_checkpoint=" + dir +
                               "/whole/checkpoints/step-3");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto a = steps_of(dir + "/whole"), b = steps_of(dir + "/resumed");
  ASSERT_EQ(b.size(), 4u);  // steps 4 to 7
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(b[i]["step"], a[i + 3]["step"]);
    EXPECT_EQ(b[i]["loss"].dump(), a[i + 3]["loss"].dump());
    EXPECT_EQ(b[i]["grad_norm"].dump(), a[i + 3]["grad_norm"].dump());
    EXPECT_EQ(b[i]["epoch"], a[i + 3]["epoch"]);
  }
  EXPECT_EQ(gradaccum::testing::read_text(dir + "/resumed/final/model.safetensors"),
            gradaccum::testing::read_text(dir + "/whole/final/model.safetensors"));
}

}  // namespace carry_test
