// ZeRO-3 on in-process ranks (Gloo over a shared HashStore): a two-unit network with a root
// parameter outside the units, its forward bracketed by the units' scope as a model's is. Each
// rank ends a window with the sum over ranks and micro-steps of its range of every unit's
// gradient; the collectives are counted per window (two all-gathers per unit per micro-step,
// defer's one reduce-scatter per unit on the last micro-step, each_micro_step's one per unit per
// micro-step); the bytes held between micro-steps are the formula's; a rank with no samples in a
// micro-step replays its peers' collectives, and one whose micro-step runs out of memory part-way
// replays the rest of them; the optimizer's step and the weight norm equal the
// unsharded ones, and unshard() gives back whole parameters.
#include "gradaccum/dist/sharded_parameters.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "gradaccum/dist/rank_states.h"
#include "gradaccum/dist/unit_shard_optimizer.h"
#include "in_process_ranks.h"

namespace sharded_parameters_test {

using gradaccum::dist::GradShardPolicy;
using gradaccum::dist::ShardedParameters;

constexpr int kWorld = 2;
constexpr int kMicroSteps = 3;
constexpr int64_t kDouble = 8;

// W1 [5, 4], b1 [5] (unit 0: 25 elements, ranges of 13), W2 [3, 5] (unit 1: 15, ranges of 8),
// s [3] (the root: 3, ranges of 2).
std::vector<torch::Tensor> make_params() {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  return {torch::linspace(-1.0, 1.0, 20, f64).reshape({5, 4}).requires_grad_(),
          torch::linspace(0.1, 0.5, 5, f64).requires_grad_(),
          torch::linspace(-0.7, 0.9, 15, f64).reshape({3, 5}).requires_grad_(),
          torch::linspace(0.5, 1.5, 3, f64).requires_grad_()};
}

gradaccum::core::ParameterUnits units_of(const std::vector<torch::Tensor>& p) { return {{p[0], p[1]}, {}, {p[2]}}; }

// Micro-step s's samples on `rank`: 3 rows of 4 features and their targets.
torch::Tensor inputs(int rank, int s) {
  return torch::cos(torch::arange(12, torch::kDouble).reshape({3, 4}) * (0.3 + 0.1 * rank) + s);
}
torch::Tensor targets(int rank, int s) {
  return torch::sin(torch::arange(9, torch::kDouble).reshape({3, 3}) + rank + s);
}

// Where a micro-step runs out of memory, as libtorch's allocator says it: inside the last unit's
// forward, or inside its backward (after its first backward node has gathered it).
enum class OutOfMemoryIn { nowhere, forward, backward };

[[noreturn]] void out_of_memory() {
  TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2.00 MiB");
  throw std::logic_error("unreachable");
}

struct FailingBackward : torch::autograd::Function<FailingBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    out_of_memory();
  }
};

// The loss sum; `scope` brackets the units as a model does (null: the plain network).
torch::Tensor loss(const std::vector<torch::Tensor>& p, gradaccum::core::UnitScope* scope, int rank, int s,
                   OutOfMemoryIn fails = OutOfMemoryIn::nowhere) {
  using gradaccum::core::run_unit;
  auto h =
      run_unit(scope, 0, inputs(rank, s), [&](const torch::Tensor& x) { return torch::tanh(x.mm(p[0].t()) + p[1]); });
  h = run_unit(scope, 1, h, [](const torch::Tensor& x) { return x; });  // a unit without parameters
  h = run_unit(scope, 2, h, [&](const torch::Tensor& x) {
    if (fails == OutOfMemoryIn::forward) out_of_memory();
    const auto y = x.mm(p[2].t());
    return fails == OutOfMemoryIn::backward ? FailingBackward::apply(y) : y;
  });
  return (h * p[3] - targets(rank, s)).square().sum();
}

// Every rank's micro-steps but `skipped` (rank, micro-step), summed: the window's gradient, flat
// per parameter.
std::vector<torch::Tensor> reference_gradient(std::pair<int, int> skipped = {-1, -1}) {
  auto p = make_params();
  for (int r = 0; r < kWorld; ++r) {
    for (int s = 0; s < kMicroSteps; ++s) {
      if (std::make_pair(r, s) != skipped) loss(p, nullptr, r, s).backward();
    }
  }
  std::vector<torch::Tensor> grads;
  for (auto& t : p) grads.push_back(t.grad().reshape({-1}).clone());
  return grads;
}

struct RankRun {
  std::vector<torch::Tensor> grad_shards;      // per flat unit (two units, then the root)
  std::vector<int64_t> reduce_scatters_after;  // after each micro-step
  int64_t all_gathers = 0;
  int64_t parameter_bytes_between = 0, gradient_bytes_between = 0;  // after micro-step 0
  double grad_norm = 0.0;
  std::vector<torch::Tensor> weights;  // after one AdamW step and unshard()
  double weight_norm = 0.0;
  int64_t owned_elements = 0, state_elements = 0;  // the optimizer's, after its step
  std::string policy;                              // sharded_policy()
};

gradaccum::optim::OptimizerSpec adamw() {
  gradaccum::optim::OptimizerSpec spec;
  spec.type = gradaccum::optim::OptimizerType::adamw;
  spec.learning_rate = 0.1;
  spec.weight_decay = 0.01;
  return spec;
}

RankRun run_window(GradShardPolicy policy, int rank, const c10::intrusive_ptr<c10d::Backend>& group,
                   std::pair<int, int> skipped, int64_t available, OutOfMemoryIn fails = OutOfMemoryIn::nowhere) {
  auto params = make_params();
  gradaccum::dist::ShardedGradSyncOptions options;
  options.policy = policy;
  options.available_bytes = available;
  ShardedParameters sharded(group, params, units_of(params), options);
  RankRun run;
  run.policy = sharded.sharded_policy();
  gradaccum::dist::UnitShardOptimizer optimizer(sharded, adamw());
  for (int s = 0; s < kMicroSteps; ++s) {
    const bool last = s + 1 == kMicroSteps;
    sharded.before_backward(last);
    if (std::make_pair(rank, s) != skipped) {
      loss(params, &sharded, rank, s).backward();
    } else if (fails != OutOfMemoryIn::nowhere) {
      // The window runner's path: a piece took the error, the micro-step is abandoned.
      EXPECT_THROW(loss(params, &sharded, rank, s, fails).backward(), c10::OutOfMemoryError);
      sharded.abandon_micro_step();
    }
    sharded.after_backward(last);
    run.reduce_scatters_after.push_back(sharded.window_reduce_scatters());
    if (s == 0) {
      run.parameter_bytes_between = sharded.held_parameter_bytes();
      run.gradient_bytes_between = sharded.held_gradient_bytes();
    }
  }
  auto totals = torch::zeros({2}, torch::kDouble);
  sharded.finish_window(totals);
  run.all_gathers = sharded.all_gather_calls();
  for (const auto& g : sharded.gradients(params)) run.grad_shards.push_back(g.clone());
  run.grad_norm = sharded.global_norm(sharded.gradients(params)).item<double>();
  optimizer.step();
  run.owned_elements = optimizer.owned_elements();
  run.state_elements = optimizer.state_elements();
  run.weight_norm = sharded.weight_norm(params).item<double>();
  sharded.unshard();
  for (const auto& p : params) run.weights.push_back(p.detach().clone());
  return run;
}

std::vector<RankRun> run_ranks(GradShardPolicy policy, std::pair<int, int> skipped = {-1, -1}, int64_t available = 0,
                               OutOfMemoryIn fails = OutOfMemoryIn::nowhere) {
  std::vector<RankRun> runs(kWorld);
  gradaccum::testing::run_on_ranks(kWorld, [&](const auto& group, int rank) {
    runs[rank] = run_window(policy, rank, group, skipped, available, fails);
  });
  return runs;
}

// Rank r's range [r·S, r·S + S) of a unit whose parameters' flat gradients are `parts`, padded.
torch::Tensor range_of(const std::vector<torch::Tensor>& parts, int64_t shard, int r) {
  auto flat = torch::cat(parts);
  flat = torch::cat({flat, torch::zeros({shard * kWorld - flat.numel()}, torch::kDouble)});
  return flat.slice(0, r * shard, (r + 1) * shard);
}

void expect_exact(const std::vector<RankRun>& runs, const std::vector<torch::Tensor>& g) {
  const auto whole_norm = torch::cat(g).norm().item<double>();
  // The unsharded step from the same summed gradient.
  auto reference = make_params();
  auto optimizer = gradaccum::optim::make_optimizer(adamw(), reference);
  for (size_t k = 0; k < reference.size(); ++k) reference[k].mutable_grad() = g[k].view_as(reference[k]).clone();
  optimizer->step();
  double weight_norm = 0.0;
  for (const auto& p : reference) weight_norm += p.detach().square().sum().item<double>();
  weight_norm = std::sqrt(weight_norm);
  for (int r = 0; r < kWorld; ++r) {
    const auto& run = runs[r];
    ASSERT_EQ(run.grad_shards.size(), 3u);
    EXPECT_LT((run.grad_shards[0] - range_of({g[0], g[1]}, 13, r)).abs().max().item<double>(), 1e-13) << r;
    EXPECT_LT((run.grad_shards[1] - range_of({g[2]}, 8, r)).abs().max().item<double>(), 1e-13) << r;
    EXPECT_LT((run.grad_shards[2] - range_of({g[3]}, 2, r)).abs().max().item<double>(), 1e-13) << r;
    EXPECT_NEAR(run.grad_norm, whole_norm, 1e-12 * whole_norm);
    EXPECT_NEAR(run.weight_norm, weight_norm, 1e-13 * weight_norm);
    for (size_t k = 0; k < reference.size(); ++k) {
      EXPECT_LT((run.weights[k] - reference[k].detach()).abs().max().item<double>(), 1e-14) << "rank " << r << " " << k;
    }
    // AdamW's two moments for this rank's elements only: rank 0 owns 13 + 8 + 2 of the 25, 15 and
    // 3 elements, rank 1 the other 12 + 7 + 1.
    EXPECT_EQ(run.owned_elements, r == 0 ? 23 : 20);
    EXPECT_EQ(run.state_elements, 2 * run.owned_elements);
  }
}

// Rank 0's bytes between micro-steps, counted from the tensors, are rank_state_bytes()'s (the
// figures `gradaccum plan` prints).
void expect_the_formula(const RankRun& rank0, GradShardPolicy policy) {
  const gradaccum::dist::ModelStates model{{25, 15}, 3, kDouble, 0, 2};
  const auto formula = gradaccum::dist::rank_state_bytes(model, kWorld, 3, policy);
  EXPECT_EQ(rank0.parameter_bytes_between, formula.parameters);
  EXPECT_EQ(rank0.gradient_bytes_between, formula.gradients);
  EXPECT_EQ(rank0.state_elements * kDouble, formula.optimizer);
}

TEST(ShardedParameters, DeferReduceScattersEachUnitOnceOnTheLastMicroStepAndGathersTwicePerMicroStep) {
  const auto runs = run_ranks(GradShardPolicy::defer);
  expect_exact(runs, reference_gradient());
  for (int r = 0; r < kWorld; ++r) {
    const auto& run = runs[r];
    EXPECT_EQ(run.reduce_scatters_after, (std::vector<int64_t>{0, 0, 3})) << "rank " << r;  // two units, the root
    EXPECT_EQ(run.all_gathers, 2 * 2 * kMicroSteps);  // forward and backward, per unit, per micro-step
    // Between micro-steps: the units' shards (13 + 8), the root whole (4, its shard a view of it);
    // the whole gradient in .grad, the units' in their flat buffers (26 + 16), the root's 3.
    EXPECT_EQ(run.parameter_bytes_between, (13 + 8 + 4) * kDouble);
    EXPECT_EQ(run.gradient_bytes_between, (26 + 16 + 3) * kDouble);
  }
  expect_the_formula(runs[0], GradShardPolicy::defer);
}

TEST(ShardedParameters, EachMicroStepReduceScattersEveryUnitEveryMicroStepAndHoldsOnlyTheShards) {
  const auto runs = run_ranks(GradShardPolicy::each_micro_step);
  expect_exact(runs, reference_gradient());
  for (int r = 0; r < kWorld; ++r) {
    const auto& run = runs[r];
    EXPECT_EQ(run.reduce_scatters_after, (std::vector<int64_t>{3, 6, 9})) << "rank " << r;
    EXPECT_EQ(run.all_gathers, 2 * 2 * kMicroSteps);
    EXPECT_EQ(run.parameter_bytes_between, (13 + 8 + 4) * kDouble);
    EXPECT_EQ(run.gradient_bytes_between, (13 + 8 + 2) * kDouble);  // the gradient shards only
  }
  expect_the_formula(runs[0], GradShardPolicy::each_micro_step);
}

// The formula's other stages, at W = 2 on the same 43 elements (ranges of 22): ZeRO-1 shards the
// moments, ZeRO-2 the gradients too, as sharded_optimizer.h and sharded_grad_sync.h allocate.
TEST(ShardedParameters, TheRankStatesFormulaForStagesZeroToTwo) {
  using gradaccum::dist::rank_state_bytes;
  const gradaccum::dist::ModelStates model{{25, 15}, 3, kDouble, 100, 2};
  const auto zero0 = rank_state_bytes(model, 2, 0, GradShardPolicy::defer);
  EXPECT_EQ(zero0.parameters, 43 * kDouble + 100);
  EXPECT_EQ(zero0.gradients, 43 * kDouble);
  EXPECT_EQ(zero0.optimizer, 2 * 43 * kDouble);
  EXPECT_EQ(rank_state_bytes(model, 2, 1, GradShardPolicy::defer).optimizer, 2 * 22 * kDouble);
  const auto each = rank_state_bytes(model, 2, 2, GradShardPolicy::each_micro_step);
  EXPECT_EQ(each.gradients, 22 * kDouble);
  EXPECT_EQ(each.transient, 43 * kDouble);
  EXPECT_EQ(rank_state_bytes(model, 2, 2, GradShardPolicy::defer).gradients, 43 * kDouble);
  EXPECT_EQ(rank_state_bytes(model, 1, 3, GradShardPolicy::defer).held(), zero0.held());  // one rank: stage 0
}

// Rank 1 has no samples in the last micro-step (a partial window): it replays its peer's
// gathers and reductions, and the sums are those of the micro-steps that ran.
TEST(ShardedParameters, ARankWithoutSamplesTakesPartInItsPeersCollectives) {
  for (const auto policy : {GradShardPolicy::defer, GradShardPolicy::each_micro_step}) {
    const auto runs = run_ranks(policy, {1, kMicroSteps - 1});
    expect_exact(runs, reference_gradient({1, kMicroSteps - 1}));
    EXPECT_EQ(runs[0].all_gathers, runs[1].all_gathers);
    EXPECT_EQ(runs[0].reduce_scatters_after, runs[1].reduce_scatters_after);
  }
}

// Rank 1 runs out of memory in the middle micro-step, inside the last unit's forward (units 0
// and 1 gathered and released, unit 2 gathered and the root's gradient not reached) or inside its
// backward (unit 2 gathered again, unit 0's prefetch started, nothing reduced): it replays the rest
// of its peer's gathers and reductions in their order, so that both ranks run the same
// collectives and the units' sums are those of the micro-steps that ran. (Out of memory, the
// window runner drops the window after its totals and trains it again at a smaller micro-batch.)
TEST(ShardedParameters, ARankWhoseMicroStepRunsOutOfMemoryPartWayReplaysTheRestOfItsPeersCollectives) {
  const std::pair<int, int> failing{1, 1};
  const auto skip = reference_gradient(failing);
  for (const auto policy : {GradShardPolicy::defer, GradShardPolicy::each_micro_step}) {
    for (const auto where : {OutOfMemoryIn::forward, OutOfMemoryIn::backward}) {
      SCOPED_TRACE(::testing::Message() << (policy == GradShardPolicy::defer ? "defer" : "each_micro_step") << ", in "
                                        << (where == OutOfMemoryIn::forward ? "forward" : "backward"));
      const auto runs = run_ranks(policy, failing, 0, where);
      const auto plain = run_ranks(policy);
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_EQ(runs[r].all_gathers, plain[r].all_gathers) << r;
        EXPECT_EQ(runs[r].reduce_scatters_after, plain[r].reduce_scatters_after) << r;
        EXPECT_LT((runs[r].grad_shards[0] - range_of({skip[0], skip[1]}, 13, r)).abs().max().item<double>(), 1e-13)
            << r;
        EXPECT_LT((runs[r].grad_shards[1] - range_of({skip[2]}, 8, r)).abs().max().item<double>(), 1e-13) << r;
      }
      // In the forward nothing reached the root; in the backward its gradient had (it lies above the
      // units), so only the forward's root sums are the skipped micro-step's.
      if (where == OutOfMemoryIn::forward) expect_exact(runs, skip);
    }
  }
}

// auto per unit: deferring holds each unit's gradient less its shard (unit 0: (25 − 13) · 8 = 96
// bytes, unit 1: 56, the root: 8). Half of 128 bytes available defers the root and unit 1 (64),
// not unit 0, which then reduce-scatters every micro-step: the sums are the same.
TEST(ShardedParameters, AutoDefersTheSmallestUnitsThatHalfTheAvailableMemoryHolds) {
  const auto choice = gradaccum::dist::choose_unit_grad_shard_policies({200, 120, 24}, {104, 64, 16}, 128);
  EXPECT_EQ(choice.policies, (std::vector<GradShardPolicy>{GradShardPolicy::each_micro_step, GradShardPolicy::defer,
                                                           GradShardPolicy::defer}));
  EXPECT_EQ(choice.reason,
            "defer for 2 of 3 units (the smallest first; 0.0 MiB more gradient held between micro-steps, within half "
            "of the 0.0 MiB available), each_micro_step for the other 1");
  EXPECT_EQ(gradaccum::dist::choose_unit_grad_shard_policies({200, 120}, {104, 64}, 0).reason,
            "each_micro_step for all 2 units: the memory available is unknown");
  const auto runs = run_ranks(GradShardPolicy::automatic, {-1, -1}, 128);
  expect_exact(runs, reference_gradient());
  for (const auto& run : runs) {
    EXPECT_EQ(run.policy, "defer 2 each_micro_step 1");
    EXPECT_EQ(run.reduce_scatters_after, (std::vector<int64_t>{1, 2, 5}));
    EXPECT_EQ(run.gradient_bytes_between, (13 + 16 + 3) * kDouble);  // unit 0 as its shard, the rest in .grad
  }
}

TEST(ShardedParameters, AModelWithoutUnitsOrWithAParameterInTwoIsRefusedInOneLine) {
  gradaccum::testing::run_on_ranks(kWorld, [&](const auto& group, int) {
    auto params = make_params();
    gradaccum::dist::ShardedGradSyncOptions options;
    options.policy = GradShardPolicy::defer;
    try {
      ShardedParameters sharded(group, params, {}, options);
      ADD_FAILURE() << "no units accepted";
    } catch (const std::exception& e) {
      EXPECT_STREQ(e.what(),
                   "zero_stage: 3 needs a model that declares its units (a decoder's blocks, a network's layers); "
                   "this model declares none that hold a trainable parameter");
    }
    try {
      ShardedParameters sharded(group, params, {{params[0]}, {params[0], params[1]}}, options);
      ADD_FAILURE() << "a parameter in two units accepted";
    } catch (const std::exception& e) {
      EXPECT_STREQ(e.what(), "zero_stage: 3: a parameter belongs to units 0 and 1 of the model");
    }
  });
}

}  // namespace sharded_parameters_test
