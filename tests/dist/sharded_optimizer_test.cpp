// ZeRO-1's optimizer on two in-process ranks (Gloo over a shared HashStore):
// each rank holds optimizer state for its own range of the flattened
// parameters only, the weights equal the unsharded optimizer's, and no
// reference to the gradients outlives a step.
#include "gradaccum/dist/sharded_optimizer.h"

#include <gtest/gtest.h>

#include "gradaccum/base/check.h"
#include "in_process_ranks.h"

namespace sharded_optimizer_test {

using gradaccum::dist::ShardedOptimizer;
using gradaccum::optim::OptimizerSpec;

constexpr int kWorld = 2;

// 10 + 7 + 6 = 23 elements: ranges of 12 and 11 at W = 2, rank 0's cutting
// the second parameter after 2 of its 7 elements.
std::vector<torch::Tensor> make_params() {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  return {torch::linspace(-1.0, 1.0, 10, f64).reshape({2, 5}).requires_grad_(),
          torch::linspace(0.5, 2.0, 7, f64).requires_grad_(),
          torch::linspace(-3.0, -0.5, 6, f64).reshape({3, 2}).requires_grad_()};
}

// Deterministic, different gradients for each step (every rank has the same:
// they stand for gradients after the all-reduce).
void set_grads(std::vector<torch::Tensor>& params, int step) {
  double phase = 0.3 * step;
  for (auto& p : params) {
    // Made in its final shape: a view (reshape) would keep its base, a second
    // holder of the storage, and blur the reference count checked below.
    p.mutable_grad() =
        torch::sin(torch::arange(p.numel(), p.options().requires_grad(false)).reshape(p.sizes()) + phase);
    phase += 1.0;
  }
}

struct RankRun {
  int64_t owned = 0;
  int64_t state = 0;
  std::vector<torch::Tensor> weights;
  std::vector<int64_t> grad_storage_refs;  // after the step, with only our own handle left
};

// Two steps of the sharded optimizer on each of kWorld threads.
std::vector<RankRun> run_sharded(const OptimizerSpec& spec,
                                 int64_t gather_bytes = ShardedOptimizer::kDefaultGatherBytes) {
  std::vector<RankRun> runs(kWorld);
  gradaccum::testing::run_on_ranks(kWorld, [&](const auto& group, int rank) {
    auto params = make_params();
    ShardedOptimizer optimizer(group, params, spec, gather_bytes);
    auto& run = runs[rank];
    for (int step = 0; step < 2; ++step) {
      set_grads(params, step);
      optimizer.step();
    }
    run.owned = optimizer.owned_elements();
    run.state = optimizer.state_elements();
    for (auto& p : params) {
      run.weights.push_back(p.detach().clone());
      const auto grad = p.grad();
      p.mutable_grad() = torch::Tensor();  // what zero_grad (set_to_none) does
      run.grad_storage_refs.push_back(static_cast<int64_t>(grad.storage().use_count()));
    }
  });
  return runs;
}

std::vector<torch::Tensor> run_unsharded(const OptimizerSpec& spec) {
  auto params = make_params();
  auto optimizer = gradaccum::optim::make_optimizer(spec, params);
  for (int step = 0; step < 2; ++step) {
    set_grads(params, step);
    optimizer->step();
  }
  return params;
}

OptimizerSpec adamw() {
  OptimizerSpec spec;
  spec.type = gradaccum::optim::OptimizerType::adamw;
  spec.learning_rate = 0.1;
  spec.weight_decay = 0.01;
  return spec;
}

OptimizerSpec sgd_with_momentum() {
  OptimizerSpec spec;
  spec.type = gradaccum::optim::OptimizerType::sgd;
  spec.learning_rate = 0.1;
  spec.momentum = 0.9;
  return spec;
}

TEST(ShardedOptimizer, EachRankHoldsAdamWMomentsForItsRangeOnly) {
  const auto runs = run_sharded(adamw());
  EXPECT_EQ(runs[0].owned, 12);
  EXPECT_EQ(runs[1].owned, 11);
  // Two moments per owned element: 24 + 22, where unsharded AdamW holds 46 on every rank.
  EXPECT_EQ(runs[0].state, 24);
  EXPECT_EQ(runs[1].state, 22);
}

TEST(ShardedOptimizer, EachRankHoldsSgdMomentumForItsRangeOnly) {
  const auto runs = run_sharded(sgd_with_momentum());
  EXPECT_EQ(runs[0].state, 12);
  EXPECT_EQ(runs[1].state, 11);
}

// In one all-gather, and in chunks of 5 elements per rank (80 bytes of float64
// output): ranges of 12 and 11 then go in chunks [0, 5), [5, 10), [10, 12),
// cutting parameters, and rank 1's last chunk carries one padding element.
TEST(ShardedOptimizer, WeightsEqualTheUnshardedOptimizersOnEveryRank) {
  for (const auto& spec : {adamw(), sgd_with_momentum()}) {
    const auto expected = run_unsharded(spec);
    for (const int64_t gather_bytes : {ShardedOptimizer::kDefaultGatherBytes, int64_t{80}}) {
      const auto runs = run_sharded(spec, gather_bytes);
      for (int rank = 0; rank < kWorld; ++rank) {
        for (size_t k = 0; k < expected.size(); ++k) {
          const double difference = (runs[rank].weights[k] - expected[k].detach()).abs().max().item<double>();
          EXPECT_LE(difference, 1e-15) << to_string(spec.type) << ", gather " << gather_bytes << ", rank " << rank
                                       << ", parameter " << k;
          // The update moved every element (both ranges reached every rank).
          const double moved = (runs[rank].weights[k] - make_params()[k].detach()).abs().min().item<double>();
          EXPECT_GT(moved, 1e-3) << to_string(spec.type) << ", gather " << gather_bytes << ", rank " << rank
                                 << ", parameter " << k;
        }
      }
    }
  }
}

TEST(ShardedOptimizer, NonPositiveGatherSizeIsAnError) {
  try {
    run_sharded(adamw(), 0);
    FAIL();
  } catch (const gradaccum::Error& e) {
    EXPECT_STREQ(e.what(), "the sharded optimizer's all-gather chunk must be > 0 bytes, not 0");
  }
}

// The shard's gradients are views of the parameters' gradients; kept after the
// step, they held this rank's gradients through the next backward (found as
// ~160 MB of extra RSS per rank on an 81M-parameter GPT-2).
TEST(ShardedOptimizer, NoReferenceToTheGradientsOutlivesAStep) {
  for (const auto& spec : {adamw(), sgd_with_momentum()}) {
    const auto runs = run_sharded(spec);
    for (int rank = 0; rank < kWorld; ++rank) {
      EXPECT_EQ(runs[rank].grad_storage_refs, (std::vector<int64_t>{1, 1, 1}))
          << to_string(spec.type) << ", rank " << rank;
    }
  }
}

}  // namespace sharded_optimizer_test
