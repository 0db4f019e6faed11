// Optimizer state saved in one layout and loaded into another (dist/optimizer_reshard.h): the
// shards of W ranks joined and cut for W' ranks, or for one whole optimizer, continue the
// optimizer exactly; parts that do not tile a parameter are refused in one line.
#include "gradaccum/dist/optimizer_reshard.h"

#include <gtest/gtest.h>

#include "gradaccum/dist/sharded_optimizer.h"
#include "gradaccum/optim/optimizer_factory.h"
#include "in_process_ranks.h"
#include "test_support.h"

namespace optimizer_reshard_test {

namespace dist = gradaccum::dist;
namespace optim = gradaccum::optim;

// 10 + 7 + 6 = 23 elements, so ranges at W = 2 and 3 cut parameters in different places.
optim::NamedParameters make_params() {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  return {{"a.weight", torch::linspace(-1.0, 1.0, 10, f64).reshape({2, 5}).requires_grad_()},
          {"b.bias", torch::linspace(0.5, 2.0, 7, f64).requires_grad_()},
          {"c.weight", torch::linspace(-3.0, -0.5, 6, f64).reshape({3, 2}).requires_grad_()}};
}

std::vector<torch::Tensor> tensors_of(const optim::NamedParameters& named) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, p] : named) out.push_back(p);
  return out;
}

void set_grads(const optim::NamedParameters& params, int step) {
  double phase = 0.3 * step;
  for (const auto& [name, p] : params) {
    p.mutable_grad() =
        torch::sin(torch::arange(p.numel(), p.options().requires_grad(false)).reshape(p.sizes()) + phase);
    phase += 1.0;
  }
}

optim::OptimizerSpec spec_of(optim::OptimizerType type) {
  optim::OptimizerSpec spec;
  spec.type = type;
  spec.learning_rate = 0.1;
  spec.weight_decay = 0.01;
  spec.momentum = 0.9;
  return spec;
}

// Steps [from, to) of a sharded optimizer on `world` in-process ranks, each starting from
// `start` (weights) and, when given, the saved `parts`; every rank's state afterwards.
struct ShardedRun {
  std::vector<optim::NamedStateTensors> parts;  // named_optimizer_state of each rank
  std::vector<torch::Tensor> weights;           // rank 0's (every rank holds the same)
};
ShardedRun run_sharded(int world, const optim::OptimizerSpec& spec, const std::vector<torch::Tensor>& start,
                       const std::vector<optim::NamedStateTensors>& parts, int from, int to) {
  ShardedRun run;
  run.parts.resize(world);
  gradaccum::testing::run_on_ranks(world, [&](const auto& group, int rank) {
    auto params = make_params();
    for (size_t i = 0; i < params.size(); ++i) params[i].second.detach().copy_(start[i]);
    dist::ShardedOptimizer optimizer(group, tensors_of(params), spec);
    if (!parts.empty()) dist::load_resharded_optimizer_state(optimizer, params, parts, "test checkpoint");
    for (int step = from; step < to; ++step) {
      set_grads(params, step);
      optimizer.step();
    }
    run.parts[rank] = dist::named_optimizer_state(optimizer, params);
    if (rank == 0) {
      for (const auto& [name, p] : params) run.weights.push_back(p.detach().clone());
    }
  });
  return run;
}

// Steps [from, to) of an unsharded optimizer over `params`.
void step_whole(torch::optim::Optimizer& optimizer, const optim::NamedParameters& params, int from, int to) {
  for (int step = from; step < to; ++step) {
    set_grads(params, step);
    optimizer.step();
  }
}

std::vector<torch::Tensor> weights_of(const optim::NamedParameters& params) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, p] : params) out.push_back(p.detach().clone());
  return out;
}

// The unsharded optimizer over steps [0, 4), the reference.
std::vector<torch::Tensor> run_whole(const optim::OptimizerSpec& spec) {
  auto params = make_params();
  auto optimizer = optim::make_optimizer(spec, tensors_of(params));
  step_whole(*optimizer, params, 0, 4);
  return weights_of(params);
}

double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double most = 0.0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, (a[i] - b[i]).abs().max().item<double>());
  return most;
}

// Two steps at W = 2, then two more at W = 3, at W = 1 through a whole optimizer, and back from
// the whole state to W = 2: each ends where four unsharded steps end.
TEST(OptimizerReshard, ShardsOfTwoRanksContinueOnThreeRanksOnOneAndBack) {
  for (const auto type : {optim::OptimizerType::adamw, optim::OptimizerType::sgd}) {
    SCOPED_TRACE(optim::to_string(type));
    const auto spec = spec_of(type);
    const auto expected = run_whole(spec);
    const auto first = run_sharded(2, spec, weights_of(make_params()), {}, 0, 2);
    ASSERT_EQ(first.parts.size(), 2u);
    EXPECT_NE(first.parts[0].front().first.find('['), std::string::npos) << first.parts[0].front().first;

    const auto three = run_sharded(3, spec, first.weights, first.parts, 2, 4);
    EXPECT_LE(max_difference(three.weights, expected), 1e-15);

    auto params = make_params();
    for (size_t i = 0; i < params.size(); ++i) params[i].second.detach().copy_(first.weights[i]);
    auto whole = optim::make_optimizer(spec, tensors_of(params));
    dist::load_resharded_optimizer_state(*whole, params, first.parts, "test checkpoint");
    step_whole(*whole, params, 2, 4);
    EXPECT_LE(max_difference(weights_of(params), expected), 1e-15);

    // The whole state after two steps, cut for two ranks.
    auto again = make_params();
    auto two_steps = optim::make_optimizer(spec, tensors_of(again));
    step_whole(*two_steps, again, 0, 2);
    const auto back = run_sharded(2, spec, weights_of(again), {optim::optimizer_state(*two_steps, again)}, 2, 4);
    EXPECT_LE(max_difference(back.weights, expected), 1e-15);
  }
}

// Joined, the shards are the whole optimizer's state element for element.
TEST(OptimizerReshard, JoinedShardsAreTheWholeStateBitForBit) {
  const auto spec = spec_of(optim::OptimizerType::adamw);
  const auto sharded = run_sharded(3, spec, weights_of(make_params()), {}, 0, 2);
  auto params = make_params();
  auto whole = optim::make_optimizer(spec, tensors_of(params));
  step_whole(*whole, params, 0, 2);
  const auto expected = optim::optimizer_state(*whole, params);
  const auto joined = dist::join_optimizer_state(sharded.parts, params, "test checkpoint");
  ASSERT_EQ(joined.size(), expected.size());
  std::map<std::string, torch::Tensor> by_name(expected.begin(), expected.end());
  for (const auto& [name, tensor] : joined) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    EXPECT_EQ(tensor.sizes(), by_name[name].sizes()) << name;
    EXPECT_TRUE(torch::equal(tensor, by_name[name])) << name;
  }
}

TEST(OptimizerReshard, PartsThatDoNotTileAParameterAreRefusedInOneLine) {
  const auto params = make_params();
  const auto step = torch::full({}, int64_t{2}, torch::kLong);
  const auto zeros = [](int64_t n) { return torch::zeros({n}, torch::kDouble); };
  auto join = [&](const std::vector<optim::NamedStateTensors>& parts) {
    return dist::join_optimizer_state(parts, params, "ckpt");
  };
  // b.bias has 7 elements.
  EXPECT_ONE_LINE_ERROR(
      join({{{"b.bias[0:4].momentum_buffer", zeros(4)}}, {{"b.bias[5:7].momentum_buffer", zeros(2)}}}),
      "ckpt: the saved parts of b.bias.momentum_buffer leave out element 4");
  EXPECT_ONE_LINE_ERROR(
      join({{{"b.bias[0:4].momentum_buffer", zeros(4)}}, {{"b.bias[3:7].momentum_buffer", zeros(4)}}}),
      "ckpt: the saved parts of b.bias.momentum_buffer cover element 3 twice");
  EXPECT_ONE_LINE_ERROR(join({{{"b.bias[0:4].momentum_buffer", zeros(4)}}}),
                        "ckpt: the saved parts of b.bias.momentum_buffer cover 4 of its 7 elements");
  EXPECT_ONE_LINE_ERROR(join({{{"b.bias[0:9].momentum_buffer", zeros(9)}}}),
                        "ckpt: optimizer state b.bias[0:9].momentum_buffer reaches past the 7 elements of b.bias");
  EXPECT_ONE_LINE_ERROR(join({{{"b.bias[0:4].momentum_buffer", zeros(3)}}}),
                        "ckpt: optimizer state b.bias[0:4].momentum_buffer holds 3 elements, its range 4");
  EXPECT_ONE_LINE_ERROR(
      join({{{"b.bias[4:2].momentum_buffer", zeros(2)}}}),
      "ckpt: optimizer state b.bias[4:2].momentum_buffer names no range [begin:end] with begin < end");
  EXPECT_ONE_LINE_ERROR(join({{{"d.weight[0:2].momentum_buffer", zeros(2)}}}),
                        "ckpt: optimizer state d.weight[0:2].momentum_buffer belongs to no parameter of this model");
  EXPECT_ONE_LINE_ERROR(
      join({{{"b.bias[0:4].step", step}, {"b.bias[0:4].exp_avg", zeros(4)}},
            {{"b.bias[4:7].step", torch::full({}, int64_t{3}, torch::kLong)}, {"b.bias[4:7].exp_avg", zeros(3)}}}),
      "ckpt: the saved parts of b.bias disagree on its step (2 and 3)");
  EXPECT_ONE_LINE_ERROR(join({{{"b.bias.step", step}}}), "ckpt: the saved parts of b.bias hold its step but no state");
  // A whole parameter's state beside shards of the others loads.
  const auto joined = join({{{"b.bias.momentum_buffer", zeros(7)}, {"c.weight[0:6].momentum_buffer", zeros(6)}}});
  ASSERT_EQ(joined.size(), 2u);
  EXPECT_EQ(joined[1].first, "c.weight.momentum_buffer");
  EXPECT_EQ(joined[1].second.sizes(), (std::vector<int64_t>{3, 2}));
}

}  // namespace optimizer_reshard_test
