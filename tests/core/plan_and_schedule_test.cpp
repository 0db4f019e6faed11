// Window planning, learning-rate schedules and the optimizer step sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "gradaccum/base/check.h"
#include "gradaccum/core/step_sequence.h"
#include "gradaccum/core/window_plan.h"
#include "gradaccum/optim/lr_schedule.h"
#include "gradaccum/optim/optimizer_factory.h"
#include "test_support.h"

namespace plan_and_schedule_test {

using namespace gradaccum;
using core::BatchGeometry;
using core::LastWindow;
using core::SampleOrder;
using core::WindowPlan;
using gradaccum::testing::error_of;

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(BatchGeometry, ArithmeticAndErrorsNameTheNumbers) {
  auto g = BatchGeometry::from_accumulation(16, 4, 2);
  EXPECT_EQ(g.global_batch(), 128);
  EXPECT_EQ(g.samples_per_micro_step(), 32);
  EXPECT_EQ(BatchGeometry::from_global(16, 128, 2).accumulation_steps(), 4);
  EXPECT_EQ(g.to_string(), "16 x 4 x 2 = 128");
  try {
    BatchGeometry::from_global(16, 100, 1);
    FAIL() << "100 is not a multiple of 16";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "global_batch_size 100 is not a multiple of per_device_train_batch_size 16 x world "
                 "size 1 = 16");
  }
  EXPECT_THROW(BatchGeometry::from_accumulation(16, 0), Error);
  EXPECT_THROW(BatchGeometry::from_accumulation(0, 4), Error);
}

// b·N·W (and b·W under global_batch_size) never wraps: a product above 2^53 is refused with the
// factors named, whatever the factors (2^62 × 4 wraps to 0 in int64, 2^62 × 3 to a negative count,
// (2^63−1)² to 1).
TEST(BatchGeometry, ProductsAboveTwoToThe53AreRefusedNamingTheFactors) {
  const int64_t two_62 = int64_t{1} << 62, max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(error_of([&] { BatchGeometry::from_accumulation(two_62, 4); }),
            "per_device_train_batch_size 4611686018427387904 x gradient_accumulation_steps 4 x world size 1 is more "
            "than the largest global batch, 2^53 = 9007199254740992 samples");
  EXPECT_EQ(error_of([&] { BatchGeometry::from_accumulation(max, max); }),
            "per_device_train_batch_size 9223372036854775807 x gradient_accumulation_steps 9223372036854775807 x "
            "world size 1 is more than the largest global batch, 2^53 = 9007199254740992 samples");
  EXPECT_NE(error_of([&] { BatchGeometry::from_accumulation(two_62, 3); }), "");
  EXPECT_NE(error_of([&] { BatchGeometry::from_accumulation(2, int64_t{1} << 52, 3); }), "");
  EXPECT_NE(error_of([&] { BatchGeometry::from_accumulation(1, 1, max); }), "");
  EXPECT_EQ(error_of([&] { BatchGeometry::from_global(two_62, int64_t{1} << 50, 4); }),
            "per_device_train_batch_size 4611686018427387904 x world size 4 is more than the largest global batch, "
            "2^53 = 9007199254740992 samples");
  EXPECT_EQ(error_of([&] { BatchGeometry::from_global(1, max); }),
            "global_batch_size 9223372036854775807 is more than the largest global batch, 2^53 = 9007199254740992 "
            "samples");
  // The largest geometry is valid, and its counts are exact.
  const auto largest = BatchGeometry::from_accumulation(int64_t{1} << 20, int64_t{1} << 31, 4);
  EXPECT_EQ(largest.global_batch(), BatchGeometry::kMaxSamples);
  EXPECT_EQ(largest.samples_per_micro_step(), int64_t{1} << 22);
  EXPECT_EQ(BatchGeometry::from_global(1, BatchGeometry::kMaxSamples).accumulation_steps(), BatchGeometry::kMaxSamples);
}

TEST(WindowPlan, WindowsDoNotDependOnTheDecomposition) {
  const int64_t n = 1000;
  const WindowPlan a(n, BatchGeometry::from_accumulation(64, 1), LastWindow::partial, 7);
  const WindowPlan b(n, BatchGeometry::from_accumulation(16, 4), LastWindow::partial, 7);
  const WindowPlan c(n, BatchGeometry::from_accumulation(4, 16), LastWindow::partial, 7);
  const WindowPlan d(n, BatchGeometry::from_accumulation(8, 4, 2), LastWindow::partial, 7);
  ASSERT_EQ(a.windows_per_epoch(), 16);  // 15 full windows of 64 and one of 40
  for (const auto* plan : {&b, &c, &d}) ASSERT_EQ(plan->windows_per_epoch(), 16);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const auto perm = a.permutation(epoch);
    EXPECT_TRUE(torch::equal(perm, b.permutation(epoch)));
    for (int64_t k = 0; k < 16; ++k) {
      const auto reference = to_vector(a.window(perm, epoch, k).samples());
      for (const auto* plan : {&b, &c, &d}) {
        const auto w = plan->window(perm, epoch, k);
        // The union of all micro-batches of all ranks is exactly the window's set.
        std::multiset<int64_t> seen;
        for (int64_t s = 0; s < w.micro_steps(); ++s) {
          for (int64_t r = 0; r < plan->geometry().world_size(); ++r) {
            for (auto i : to_vector(w.micro_batch(s, r))) seen.insert(i);
          }
        }
        EXPECT_EQ(seen, std::multiset<int64_t>(reference.begin(), reference.end()));
      }
    }
  }
  // The last window: 40 samples.
  const auto last = b.window(b.permutation(0), 0, 15);
  EXPECT_TRUE(last.is_partial());
  EXPECT_EQ(last.size(), 40);
  EXPECT_EQ(last.micro_steps(), 3);  // 16 + 16 + 8
  EXPECT_EQ(last.micro_batch(2).size(0), 8);
  const auto last_dp = d.window(d.permutation(0), 0, 15);  // 8 × 2 ranks: chunks 8,8,8,8,8
  EXPECT_EQ(last_dp.micro_steps(), 3);
  EXPECT_EQ(last_dp.samples_of_rank(0), 24);
  EXPECT_EQ(last_dp.samples_of_rank(1), 16);
  EXPECT_EQ(last_dp.micro_batch(2, 1).size(0), 0);  // rank 1 idles in the last micro-step
}

TEST(WindowPlan, EpochsArePermutationsAndDiffer) {
  const WindowPlan plan(100, BatchGeometry::from_accumulation(10, 1), LastWindow::partial, 42);
  const auto e0 = plan.permutation(0), e1 = plan.permutation(1);
  EXPECT_TRUE(torch::equal(std::get<0>(e0.sort()), torch::arange(100, torch::kLong)));
  EXPECT_TRUE(torch::equal(std::get<0>(e1.sort()), torch::arange(100, torch::kLong)));
  EXPECT_FALSE(torch::equal(e0, e1));
  EXPECT_TRUE(torch::equal(e0, plan.permutation(0)));  // a pure function of (seed, epoch)
  const WindowPlan other_seed(100, BatchGeometry::from_accumulation(10, 1), LastWindow::partial, 43);
  EXPECT_FALSE(torch::equal(e0, other_seed.permutation(0)));
  // The documented seed derivation (splitmix64), pinned so peers can reproduce it.
  EXPECT_EQ(WindowPlan::epoch_seed(42, 0), 0xbdd732262feb6e95ULL);
}

TEST(WindowPlan, GroupByLengthSortsInsideWindowsOnly) {
  const int64_t n = 50;
  const auto lengths = torch::arange(n, torch::kLong).remainder(7) + 1;  // ties on purpose
  WindowPlan plain(n, BatchGeometry::from_accumulation(4, 3), LastWindow::partial, 9);
  WindowPlan grouped(n, BatchGeometry::from_accumulation(4, 3), LastWindow::partial, 9);
  grouped.group_by_length(lengths);
  const auto permutation = plain.permutation(1);
  for (int64_t k = 0; k < plain.windows_per_epoch(); ++k) {
    const auto a = plain.window(permutation, 1, k).samples();
    const auto b = grouped.window(permutation, 1, k).samples();
    // The same samples...
    EXPECT_TRUE(torch::equal(std::get<0>(a.sort()), std::get<0>(b.sort()))) << k;
    // ...longest first.
    const auto l = lengths.index_select(0, b);
    EXPECT_TRUE((l.slice(0, 0, -1) >= l.slice(0, 1)).all().item<bool>()) << k;
  }
  // The first window's first micro-batch holds its 4 longest samples.
  const auto w = grouped.window(permutation, 1, 0);
  EXPECT_EQ(lengths.index_select(0, w.micro_batch(0)).min().item<int64_t>(),
            std::get<0>(lengths.index_select(0, w.samples()).sort(0, true)).select(0, 3).item<int64_t>());
  EXPECT_THROW(grouped.group_by_length(torch::ones({3})), gradaccum::Error);
}

TEST(WindowPlan, DropAndTooSmallDatasets) {
  EXPECT_EQ(WindowPlan(10, BatchGeometry::from_accumulation(2, 4), LastWindow::partial, 1).windows_per_epoch(), 2);
  EXPECT_EQ(WindowPlan(10, BatchGeometry::from_accumulation(2, 4), LastWindow::drop, 1).windows_per_epoch(), 1);
  EXPECT_EQ(WindowPlan(5, BatchGeometry::from_accumulation(2, 4), LastWindow::partial, 1).windows_per_epoch(), 1);
  EXPECT_THROW(WindowPlan(5, BatchGeometry::from_accumulation(2, 4), LastWindow::drop, 1), Error);
  EXPECT_THROW(WindowPlan(0, BatchGeometry::from_accumulation(2, 4), LastWindow::partial, 1), Error);
}

TEST(WindowPlan, SequentialOrderTakesTheSamplesAsStoredEveryEpoch) {
  const WindowPlan plan(10, BatchGeometry::from_accumulation(2, 2, 2), LastWindow::partial, 1, SampleOrder::sequential);
  for (int64_t epoch : {0, 3}) {
    const auto permutation = plan.permutation(epoch);
    EXPECT_TRUE(torch::equal(permutation, torch::arange(10, torch::kLong))) << epoch;
    // Window 1 = samples 8, 9 (partial): micro-step 0 gives rank 0 sample 8..9, rank 1 nothing.
    const auto last = plan.window(permutation, epoch, 1);
    EXPECT_EQ(last.micro_steps(), 1);
    EXPECT_TRUE(torch::equal(last.micro_batch(0, 0), torch::tensor({8, 9}, torch::kLong)));
    EXPECT_EQ(last.micro_batch(0, 1).numel(), 0);
    // Window 0, micro-step 1, rank 1 = chunk 3 = samples 6, 7.
    EXPECT_TRUE(
        torch::equal(plan.window(permutation, epoch, 0).micro_batch(1, 1), torch::tensor({6, 7}, torch::kLong)));
  }
  // The random order is not the identity (the sequential one is not the default).
  const WindowPlan random(10, BatchGeometry::from_accumulation(2, 2, 2), LastWindow::partial, 1);
  EXPECT_FALSE(torch::equal(random.permutation(0), torch::arange(10, torch::kLong)));
}

TEST(LrSchedule, WarmupThenConstantLinearCosine) {
  using optim::LrSchedule;
  using optim::ScheduleType;
  const LrSchedule constant(ScheduleType::constant, 1.0, 4, 20);
  EXPECT_DOUBLE_EQ(constant.at(0), 0.0);
  EXPECT_DOUBLE_EQ(constant.at(1), 0.25);
  EXPECT_DOUBLE_EQ(constant.at(4), 1.0);
  EXPECT_DOUBLE_EQ(constant.at(19), 1.0);
  const LrSchedule linear(ScheduleType::linear, 2.0, 0, 10);
  EXPECT_DOUBLE_EQ(linear.at(0), 2.0);
  EXPECT_DOUBLE_EQ(linear.at(5), 1.0);
  EXPECT_DOUBLE_EQ(linear.at(9), 0.2);
  EXPECT_DOUBLE_EQ(linear.at(10), 0.0);
  const LrSchedule cosine(ScheduleType::cosine, 1.0, 2, 12);
  EXPECT_DOUBLE_EQ(cosine.at(1), 0.5);
  EXPECT_DOUBLE_EQ(cosine.at(2), 1.0);
  EXPECT_NEAR(cosine.at(7), 0.5, 1e-15);  // half-way through the decay
  EXPECT_NEAR(cosine.at(12), 0.0, 1e-15);
  EXPECT_NEAR(cosine.at(3), 0.5 * (1 + std::cos(M_PI * 0.1)), 1e-15);
  EXPECT_THROW(LrSchedule(ScheduleType::constant, -1.0, 0, 10), Error);
  EXPECT_EQ(optim::schedule_type_names().parse("cosine", "lr_scheduler_type"), ScheduleType::cosine);
  EXPECT_EQ(optim::to_string(ScheduleType::linear), "linear");
  EXPECT_THROW(optim::schedule_type_names().parse("exp", "lr_scheduler_type"), Error);
}

TEST(StepSequence, ClipThenStepThenZeroThenSchedule) {
  auto w = torch::zeros({4}, torch::kDouble).requires_grad_();
  auto optimizer = optim::make_optimizer({optim::OptimizerType::sgd, 0.1}, {w});
  core::StepSequence steps(*optimizer, {w}, optim::LrSchedule(optim::ScheduleType::linear, 0.1, 0, 4), 0.5);
  EXPECT_DOUBLE_EQ(optimizer->param_groups()[0].options().get_lr(), 0.1);
  w.mutable_grad() = torch::tensor({1.0, 1.0, 1.0, 1.0}, torch::kDouble);  // ‖g‖ = 2
  const auto r = steps.apply();
  EXPECT_DOUBLE_EQ(r.grad_norm.item<double>(), 2.0);
  EXPECT_NEAR(r.grad_norm_clipped.item<double>(), 0.5, 1e-6);
  EXPECT_DOUBLE_EQ(r.lr, 0.1);
  // The update used the clipped gradient: 0.1 × 0.25 per element.
  EXPECT_TRUE(torch::allclose(w.detach(), torch::full({4}, -0.025, torch::kDouble), 0, 1e-7));
  EXPECT_FALSE(w.grad().defined());  // zeroed
  EXPECT_EQ(steps.step(), 1);
  EXPECT_DOUBLE_EQ(optimizer->param_groups()[0].options().get_lr(), 0.075);  // scheduler stepped
  // Without clipping the norms agree.
  w.mutable_grad() = torch::tensor({0.1, 0.0, 0.0, 0.0}, torch::kDouble);
  const auto unclipped = steps.apply();
  EXPECT_DOUBLE_EQ(unclipped.grad_norm.item<double>(), unclipped.grad_norm_clipped.item<double>());
}

TEST(Optimizers, NesterovNeedsMomentumAndTheTypesHaveTheirConfigNames) {
  auto w = torch::zeros({2}).requires_grad_();
  optim::OptimizerSpec spec;
  spec.type = optim::OptimizerType::sgd;
  spec.nesterov = true;
  EXPECT_THROW(optim::make_optimizer(spec, {w}), Error);
  spec.momentum = 0.9;
  EXPECT_NO_THROW(optim::make_optimizer(spec, {w}));
  EXPECT_EQ(optim::optimizer_type_names().names(), (std::vector<std::string>{"adamw", "sgd"}));
  EXPECT_EQ(optim::optimizer_type_names().parse("sgd", "optim"), optim::OptimizerType::sgd);
  EXPECT_EQ(error_of([] { optim::optimizer_type_names().parse("lamb", "optim"); }),
            "optim: 'lamb' is not one of adamw | sgd");
}

}  // namespace plan_and_schedule_test
