// optim::FusedAdamW (libtorch's at::_fused_adamw_) against torch::optim::AdamW:
// the same trajectory to rounding, amsgrad included, and bit for bit where it
// takes torch::optim::AdamW's operators (non-contiguous tensors).
#include "gradaccum/optim/fused_adamw.h"

#include <gtest/gtest.h>

#include "dtype_cases.h"
#include "gradaccum/optim/optimizer_factory.h"
#include "test_support.h"

namespace fused_adamw_test {

using gradaccum::optim::FusedAdamW;
using gradaccum::testing::max_relative_difference;

struct Run {
  std::vector<torch::Tensor> params, exp_avg, exp_avg_sq;
};

// Five steps on three parameters (one of 40,000 elements, enough for several
// parallel chunks) with fresh pseudo-random gradients, from the same start.
template <typename Optimizer>
Run train(torch::ScalarType dtype, torch::optim::AdamWOptions options) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> params = {torch::randn({7, 5}, dtype), torch::randn({40000}, dtype),
                                       torch::randn({3}, dtype)};
  for (auto& p : params) p.requires_grad_(true);
  Optimizer optimizer(params, options);
  for (int step = 0; step < 5; ++step) {
    for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes(), dtype);
    optimizer.step();
  }
  Run run;
  for (auto& p : params) {
    run.params.push_back(p.detach().clone());
    void* const key = p.unsafeGetTensorImpl();
    auto& state = static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(key));
    EXPECT_EQ(state.step(), 5);
    run.exp_avg.push_back(state.exp_avg().clone());
    run.exp_avg_sq.push_back(state.exp_avg_sq().clone());
  }
  return run;
}

double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, max_relative_difference(a[i], b[i]));
  return worst;
}

void expect_same_trajectory(torch::ScalarType dtype, double tolerance) {
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1).betas({0.8, 0.95}).eps(1e-6);
  const auto fused = train<FusedAdamW>(dtype, options);
  const auto reference = train<torch::optim::AdamW>(dtype, options);
  EXPECT_LE(max_difference(fused.params, reference.params), tolerance);
  EXPECT_LE(max_difference(fused.exp_avg, reference.exp_avg), tolerance);
  EXPECT_LE(max_difference(fused.exp_avg_sq, reference.exp_avg_sq), tolerance);
  // The parameters did move (five steps of about lr each).
  torch::manual_seed(3);
  EXPECT_GT((fused.params[0] - torch::randn({7, 5}, dtype)).abs().max().item<double>(), 1e-2);
}

class FusedAdamWDtypes : public ::testing::TestWithParam<gradaccum::testing::DtypeCase> {};

TEST_P(FusedAdamWDtypes, SameTrajectoryAsLibtorch) { expect_same_trajectory(GetParam().dtype, GetParam().tolerance); }

INSTANTIATE_TEST_SUITE_P(, FusedAdamWDtypes, gradaccum::testing::dtype_cases(1e-13, 1e-5),
                         gradaccum::testing::dtype_case_name);

TEST(FusedAdamW, AmsgradFollowsLibtorchsAdamW) {
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true);
  const auto fused = train<FusedAdamW>(torch::kFloat, options);
  const auto reference = train<torch::optim::AdamW>(torch::kFloat, options);
  EXPECT_LE(max_difference(fused.params, reference.params), 1e-5);
  EXPECT_LE(max_difference(fused.exp_avg_sq, reference.exp_avg_sq), 1e-5);
}

// A non-contiguous parameter takes the operators too, and a sparse gradient
// is refused as libtorch refuses it.
TEST(FusedAdamW, NonContiguousParametersAndSparseGradients) {
  auto p = torch::randn({4, 6}).t().clone().requires_grad_(true);  // a leaf with transposed strides
  ASSERT_FALSE(p.is_contiguous());
  auto q = p.detach().clone().requires_grad_(true);
  FusedAdamW fused({p}, torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW reference({q}, torch::optim::AdamWOptions(1e-2));
  const auto grad = torch::randn({6, 4});
  p.mutable_grad() = grad.clone();
  q.mutable_grad() = grad.clone();
  fused.step();
  reference.step();
  EXPECT_TRUE(torch::equal(p, q)) << (p - q).abs().max().item<double>();
  p.mutable_grad() = torch::eye(6).narrow(1, 0, 4).to_sparse();
  EXPECT_THROW(fused.step(), c10::Error);
}

// Weight decay reaches matrices and embeddings, not biases and gains (HF Trainer's split for
// GPT-2/BLOOM): with zero gradients AdamW's only move is the decay, p ← p·(1 − lr·wd). SGD
// too; the flags a sharded optimizer passes override the dimension rule.
TEST(MakeOptimizer, WeightDecaySkipsBiasesAndNormGains) {
  for (const std::string type : {"adamw", "sgd"}) {
    auto matrix = torch::ones({2, 3}, torch::kDouble).requires_grad_();
    auto bias = torch::ones({3}, torch::kDouble).requires_grad_();
    auto flat = torch::ones({4}, torch::kDouble).requires_grad_();  // a shard of a matrix
    gradaccum::optim::OptimizerSpec spec;
    spec.type = gradaccum::optim::optimizer_type_names().parse(type, "optim");
    spec.learning_rate = 0.5;
    spec.weight_decay = 0.1;
    auto optimizer = gradaccum::optim::make_optimizer(spec, {matrix, bias, flat}, {true, false, true});
    for (auto* p : {&matrix, &bias, &flat}) p->mutable_grad() = torch::zeros_like(*p);
    optimizer->step();
    EXPECT_DOUBLE_EQ(matrix.min().item<double>(), 1.0 - 0.5 * 0.1) << type;
    EXPECT_DOUBLE_EQ(flat.max().item<double>(), 1.0 - 0.5 * 0.1) << type;
    EXPECT_DOUBLE_EQ(bias.min().item<double>(), 1.0) << type;
    EXPECT_EQ(optimizer->param_groups().size(), 2u) << type;
  }
  EXPECT_TRUE(gradaccum::optim::takes_weight_decay(torch::zeros({4, 1, 3, 3})));  // a conv kernel
  EXPECT_FALSE(gradaccum::optim::takes_weight_decay(torch::zeros({4})));
  // Without weight decay, one group as before.
  gradaccum::optim::OptimizerSpec plain;
  EXPECT_EQ(gradaccum::optim::make_optimizer(plain, {torch::zeros({2, 2}), torch::zeros({2})})->param_groups().size(),
            1u);
}

}  // namespace fused_adamw_test
