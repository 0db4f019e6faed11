// ZeRO-2's reducer on two in-process ranks (Gloo over a shared HashStore): each rank ends a window
// with the sum over ranks and micro-steps of its own range of the gradient, with defer's one
// reduce-scatter per chunk on the last micro-step or each_micro_step's one per chunk per
// micro-step; the gradient bytes it holds between micro-steps are the whole gradient's or its
// shard's; the global norm and ZeRO-2's optimizer step equal the unsharded ones.
#include "gradaccum/dist/sharded_grad_sync.h"

#include <gtest/gtest.h>

#include "gradaccum/dist/sharded_optimizer.h"
#include "in_process_ranks.h"

namespace sharded_grad_sync_test {

using gradaccum::dist::GradShardPolicy;
using gradaccum::dist::ShardedGradSync;

constexpr int kWorld = 2;
constexpr int kMicroSteps = 3;

// 10 + 7 + 6 = 23 float64 elements: ranges of 12 and 11 (padded to 12) at W = 2.
std::vector<torch::Tensor> make_params() {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  return {torch::linspace(-1.0, 1.0, 10, f64).reshape({2, 5}).requires_grad_(),
          torch::linspace(0.5, 2.0, 7, f64).requires_grad_(),
          torch::linspace(-3.0, -0.5, 6, f64).reshape({3, 2}).requires_grad_()};
}

// Micro-step s's gradient on `rank`, flattened over the parameters: a known function of both.
torch::Tensor known_gradient(int rank, int s) {
  return torch::sin(torch::arange(23, torch::kDouble) * (0.1 + 0.2 * rank) + s);
}

// One micro-step whose backward produces known_gradient(rank, s).
void micro_step(ShardedGradSync& sync, std::vector<torch::Tensor>& params, int rank, int s) {
  const bool last = s + 1 == kMicroSteps;
  sync.before_backward(last);
  const auto g = known_gradient(rank, s);
  auto loss = torch::zeros({}, torch::kDouble);
  int64_t at = 0;
  for (auto& p : params) {
    loss = loss + (p * g.slice(0, at, at + p.numel()).view_as(p)).sum();
    at += p.numel();
  }
  loss.backward();
  sync.after_backward(last);
}

struct RankRun {
  int64_t held_between_micro_steps = 0;         // gradient bytes after micro-step 0
  std::vector<int64_t> reduce_scatters_before;  // before each micro-step
  int64_t calls = 0, bytes = 0, chunks = 0;
  torch::Tensor shard;  // the window's summed gradient of this rank's range
  double norm = 0.0;    // the global norm from the shards
  bool grads_released = false;
};

RankRun run_window(GradShardPolicy policy, int rank, const c10::intrusive_ptr<c10d::Backend>& group) {
  auto params = make_params();
  gradaccum::dist::ShardedGradSyncOptions options;
  options.policy = policy;
  options.bucket_bytes = 80;  // 80 / (2 ranks × 8 bytes): chunks of 5 elements, 3 per range of 12
  ShardedGradSync sync(group, params, options);
  RankRun run;
  for (int s = 0; s < kMicroSteps; ++s) {
    run.reduce_scatters_before.push_back(sync.window_reduce_scatters());
    micro_step(sync, params, rank, s);
    if (s == 0) run.held_between_micro_steps = sync.held_gradient_bytes();
  }
  auto totals = torch::tensor({1.0 + rank, 2.0}, torch::kDouble);
  sync.finish_window(totals);
  run.calls = sync.allreduce_calls();
  run.bytes = sync.allreduce_bytes();
  run.chunks = sync.chunks();
  run.shard = sync.gradient_shard().clone();
  run.norm = sync.global_norm(sync.gradients(params)).item<double>();
  run.grads_released = true;
  for (const auto& p : params) run.grads_released = run.grads_released && !p.grad().defined();
  return run;
}

std::vector<RankRun> run_ranks(GradShardPolicy policy) {
  std::vector<RankRun> runs(kWorld);
  gradaccum::testing::run_on_ranks(kWorld,
                                   [&](const auto& group, int rank) { runs[rank] = run_window(policy, rank, group); });
  return runs;
}

torch::Tensor summed_gradient() {
  auto sum = torch::zeros({23}, torch::kDouble);
  for (int r = 0; r < kWorld; ++r) {
    for (int s = 0; s < kMicroSteps; ++s) sum += known_gradient(r, s);
  }
  return sum;
}

TEST(ShardedGradSync, DeferReduceScattersOncePerChunkOnTheLastMicroStepAndHoldsTheWholeGradientBefore) {
  const auto runs = run_ranks(GradShardPolicy::defer);
  const auto sum = summed_gradient();
  for (int r = 0; r < kWorld; ++r) {
    const auto& run = runs[r];
    EXPECT_EQ(run.chunks, 3);
    EXPECT_EQ(run.reduce_scatters_before, (std::vector<int64_t>{0, 0, 0})) << "rank " << r;
    EXPECT_EQ(run.calls, 3);
    EXPECT_EQ(run.bytes, 2 * 12 * 8);                                 // each chunk's input: both ranks' pieces
    EXPECT_EQ(run.held_between_micro_steps, 23 * 8) << "rank " << r;  // the whole gradient
    EXPECT_TRUE(run.grads_released);
    const int64_t begin = 12 * r, end = std::min<int64_t>(23, begin + 12);
    ASSERT_EQ(run.shard.numel(), end - begin);
    EXPECT_LT((run.shard - sum.slice(0, begin, end)).abs().max().item<double>(), 1e-14) << "rank " << r;
    EXPECT_NEAR(run.norm, sum.norm().item<double>(), 1e-13);
  }
}

TEST(ShardedGradSync, EachMicroStepReduceScattersEveryMicroStepAndHoldsOnlyTheShard) {
  const auto runs = run_ranks(GradShardPolicy::each_micro_step);
  const auto sum = summed_gradient();
  for (int r = 0; r < kWorld; ++r) {
    const auto& run = runs[r];
    EXPECT_EQ(run.reduce_scatters_before, (std::vector<int64_t>{0, 3, 6})) << "rank " << r;
    EXPECT_EQ(run.calls, 3 * kMicroSteps);
    EXPECT_EQ(run.bytes, kMicroSteps * 2 * 12 * 8);
    EXPECT_EQ(run.held_between_micro_steps, 12 * 8) << "rank " << r;  // ceil(23 / 2) elements
    EXPECT_TRUE(run.grads_released);
    const int64_t begin = 12 * r, end = std::min<int64_t>(23, begin + 12);
    EXPECT_LT((run.shard - sum.slice(0, begin, end)).abs().max().item<double>(), 1e-14) << "rank " << r;
    EXPECT_NEAR(run.norm, sum.norm().item<double>(), 1e-13);
  }
}

// The ShardedOptimizer stepping from the shards gives every rank the weights that AdamW gives
// from the whole summed gradient.
TEST(ShardedGradSync, ShardedOptimizerStepsFromTheShardToTheUnshardedWeights) {
  gradaccum::optim::OptimizerSpec spec;
  spec.type = gradaccum::optim::OptimizerType::adamw;
  spec.learning_rate = 0.1;
  spec.weight_decay = 0.01;
  std::vector<std::vector<torch::Tensor>> weights(kWorld);
  gradaccum::testing::run_on_ranks(kWorld, [&](const auto& group, int rank) {
    auto params = make_params();
    gradaccum::dist::ShardedGradSyncOptions options;
    options.policy = GradShardPolicy::each_micro_step;
    ShardedGradSync sync(group, params, options);
    gradaccum::dist::ShardedOptimizer optimizer(group, params, spec);
    optimizer.take_gradients_from(sync);
    for (int window = 0; window < 2; ++window) {
      for (int s = 0; s < kMicroSteps; ++s) micro_step(sync, params, rank, s);
      auto totals = torch::zeros({2}, torch::kDouble);
      sync.finish_window(totals);
      optimizer.step();
    }
    for (auto& p : params) weights[rank].push_back(p.detach().clone());
  });
  auto params = make_params();
  auto reference = gradaccum::optim::make_optimizer(spec, params);
  const auto sum = summed_gradient();
  for (int window = 0; window < 2; ++window) {
    int64_t at = 0;
    for (auto& p : params) {
      p.mutable_grad() = sum.slice(0, at, at + p.numel()).view_as(p).clone();
      at += p.numel();
    }
    reference->step();
  }
  for (int r = 0; r < kWorld; ++r) {
    for (size_t k = 0; k < params.size(); ++k) {
      EXPECT_LT((weights[r][k] - params[k].detach()).abs().max().item<double>(), 1e-14) << "rank " << r << " p " << k;
    }
  }
}

TEST(ShardedGradSync, AutoDefersWhenTheWholeGradientFitsInHalfTheAvailableMemory) {
  using gradaccum::dist::choose_grad_shard_policy;
  constexpr int64_t kMiB = 1024 * 1024;
  const auto fits = choose_grad_shard_policy(100 * kMiB, 25 * kMiB, 150 * kMiB);
  EXPECT_EQ(fits.policy, GradShardPolicy::defer);
  EXPECT_EQ(fits.reason,
            "defer: deferring holds the whole gradient between micro-steps, 75.0 MiB more than the shard, within half "
            "of the 150.0 MiB available (the other half left to a micro-batch's activations)");
  EXPECT_EQ(choose_grad_shard_policy(100 * kMiB, 25 * kMiB, 149 * kMiB).policy, GradShardPolicy::each_micro_step);
  const auto unknown = choose_grad_shard_policy(100 * kMiB, 25 * kMiB, 0);
  EXPECT_EQ(unknown.policy, GradShardPolicy::each_micro_step);
  EXPECT_EQ(unknown.reason,
            "each_micro_step: the memory available is unknown, and deferring would hold 75.0 MiB more gradient "
            "between micro-steps");
}

}  // namespace sharded_grad_sync_test
