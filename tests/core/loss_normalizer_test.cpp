// core/loss_normalizer.h on its own, with numbers worked by hand: one parameter w = 1 and
// micro-batch losses sum_k = a_k · w over c_k items, so every gradient is a sum of a_k's.
// Micro-batches (a, c) = (6, 3) and (3, 1), N = 2:
//   window:      loss = gradient = (6 + 3) / (3 + 1) = 9/4
//   sum:         loss = gradient = 9
//   micro_batch: loss = gradient = (6/3 + 3/1) / 2 = 5/2
// Also: the loss multiplier (fp16's scale) divided out, ranks combined, an empty window, and a
// window saved mid-way and restored continuing with the same totals.
#include "gradaccum/core/loss_normalizer.h"

#include <gtest/gtest.h>

namespace loss_normalizer_test {

using gradaccum::core::LossNormalization;
using gradaccum::core::LossNormalizer;
using gradaccum::core::LossSum;

struct Outcome {
  double loss, count, grad;
};

// Runs micro-batches {(a, c)} through `normalizer` with backward on w = 1 (times
// `multiplier`, as the fp16 path multiplies each objective), then finish() on `world` ranks
// whose totals are this rank's times `world` (identical ranks).
Outcome run(LossNormalization mode, const std::vector<std::pair<double, int64_t>>& micro, int64_t n,
            double multiplier = 1.0, int64_t world = 1) {
  auto w = torch::ones({}, torch::kDouble).requires_grad_();
  LossNormalizer normalizer(mode, n);
  normalizer.begin_window();
  for (const auto& [a, c] : micro) {
    LossSum l{a * w, torch::tensor(c, torch::kLong)};
    (normalizer.objective(l) * multiplier).backward();
  }
  if (world > 1) w.mutable_grad().mul_(static_cast<double>(world));  // the all-reduce's sum
  const auto totals = normalizer.local_totals() * static_cast<double>(world);
  const auto result = normalizer.finish(totals, {w.grad()}, world, multiplier);
  return {result.loss.item<double>(), result.count.item<double>(), w.grad().item<double>()};
}

TEST(LossNormalizer, WindowDividesTheSummedGradientOnceByTheWindowsCount) {
  const auto o = run(LossNormalization::window, {{6, 3}, {3, 1}}, 2);
  EXPECT_DOUBLE_EQ(o.loss, 9.0 / 4.0);
  EXPECT_DOUBLE_EQ(o.count, 4.0);
  EXPECT_DOUBLE_EQ(o.grad, 9.0 / 4.0);
}

TEST(LossNormalizer, SumLeavesTheGradientsAsAccumulated) {
  const auto o = run(LossNormalization::sum, {{6, 3}, {3, 1}}, 2);
  EXPECT_DOUBLE_EQ(o.loss, 9.0);
  EXPECT_DOUBLE_EQ(o.grad, 9.0);
}

TEST(LossNormalizer, MicroBatchAveragesTheMeansOverTheConfiguredSteps) {
  const auto o = run(LossNormalization::micro_batch, {{6, 3}, {3, 1}}, 2);
  EXPECT_DOUBLE_EQ(o.loss, (2.0 + 3.0) / 2.0);  // 2.5, not the window mean 9/4
  EXPECT_DOUBLE_EQ(o.grad, 2.5);
  // A partial window (1 of N = 2 micro-steps) still divides by N: the naive loop's bias.
  EXPECT_DOUBLE_EQ(run(LossNormalization::micro_batch, {{6, 3}}, 2).grad, 1.0);
  EXPECT_DOUBLE_EQ(run(LossNormalization::window, {{6, 3}}, 2).grad, 2.0);
}

TEST(LossNormalizer, TheLossMultiplierIsDividedOutAndRanksCombine) {
  for (const auto mode : {LossNormalization::window, LossNormalization::sum, LossNormalization::micro_batch}) {
    const auto plain = run(mode, {{6, 3}, {3, 1}}, 2);
    const auto scaled = run(mode, {{6, 3}, {3, 1}}, 2, /*multiplier=*/1024.0);
    EXPECT_DOUBLE_EQ(scaled.grad, plain.grad);
    EXPECT_DOUBLE_EQ(scaled.loss, plain.loss);
  }
  // Two identical ranks: the window mean and the naive average are unchanged, the sum doubles.
  EXPECT_DOUBLE_EQ(run(LossNormalization::window, {{6, 3}, {3, 1}}, 2, 1.0, 2).grad, 9.0 / 4.0);
  EXPECT_DOUBLE_EQ(run(LossNormalization::micro_batch, {{6, 3}, {3, 1}}, 2, 1.0, 2).grad, 2.5);
  EXPECT_DOUBLE_EQ(run(LossNormalization::sum, {{6, 3}, {3, 1}}, 2, 1.0, 2).grad, 18.0);
}

TEST(LossNormalizer, AWindowWithoutItemsHasZeroLossNotNan) {
  const auto o = run(LossNormalization::window, {{0, 0}}, 1);
  EXPECT_DOUBLE_EQ(o.loss, 0.0);
  EXPECT_DOUBLE_EQ(o.grad, 0.0);
}

TEST(LossNormalizer, RestoredTotalsContinueTheWindowExactly) {
  LossNormalizer first(LossNormalization::micro_batch, 2);
  first.begin_window();
  auto w = torch::ones({}, torch::kDouble).requires_grad_();
  first.objective({6.0 * w, torch::tensor(3, torch::kLong)});
  const auto saved = first.local_totals();
  EXPECT_DOUBLE_EQ(saved[0].item<double>(), 6.0);
  EXPECT_DOUBLE_EQ(saved[1].item<double>(), 3.0);
  EXPECT_DOUBLE_EQ(saved[2].item<double>(), 1.0);

  LossNormalizer second(LossNormalization::micro_batch, 2);
  second.begin_window();
  second.restore(saved);
  second.objective({3.0 * w, torch::tensor(1, torch::kLong)});
  EXPECT_TRUE(torch::equal(second.local_totals(), torch::tensor({9.0, 4.0, 2.5}, torch::kDouble)));
}

}  // namespace loss_normalizer_test
