// optim::FusedAdamW against libtorch's AdamW: the same trajectory to rounding
// on its own loop and on libtorch's fused op (custom kernel fused_adamw off, and
// amsgrad), bit for bit where it takes libtorch's operators.
#include <gtest/gtest.h>

#include <limits>

#include "gradaccum/core/custom_kernels.h"
#include "gradaccum/optim/fused_adamw.h"
#include "test_support.h"

namespace {

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

TEST(FusedAdamW, SameTrajectoryAsLibtorchFloat64) { expect_same_trajectory(torch::kDouble, 1e-13); }

TEST(FusedAdamW, SameTrajectoryAsLibtorchFloat32) { expect_same_trajectory(torch::kFloat, 1e-5); }

// With the custom kernel off every contiguous parameter goes to libtorch's at::_fused_adamw_.
TEST(FusedAdamW, LibtorchFusedOpGivesTheSameTrajectory) {
  gradaccum::testing::CustomKernelsScope off("none");
  expect_same_trajectory(torch::kDouble, 1e-13);
  expect_same_trajectory(torch::kFloat, 1e-5);
}

// amsgrad is not in this engine's loop: libtorch's fused op takes it.
TEST(FusedAdamW, AmsgradTakesLibtorchsFusedOp) {
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

}  // namespace

namespace {

// A parameter whose gradient turned zero: its first moment decays by β₁ per
// step into the subnormal range, where the fused pass flushes it to zero
// (float32); the parameter itself moves exactly as under libtorch's AdamW.
TEST(FusedAdamW, SubnormalMomentsFlushToZeroWithoutMovingTheParameterDifferently) {
  const float tiny = std::numeric_limits<float>::min();  // smallest normal float
  auto run = [&](auto& optimizer, torch::Tensor& p) {
    p.mutable_grad() = torch::full({4}, 1.0f);
    optimizer.step();  // state created; then the moments are set by hand
    void* const key = p.unsafeGetTensorImpl();
    auto& state = static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(key));
    state.exp_avg().fill_(tiny);
    p.mutable_grad() = torch::zeros({4});
    optimizer.step();  // m = 0.9 · FLT_MIN: subnormal
    return state.exp_avg().clone();
  };
  auto p = torch::ones({4}).requires_grad_(true);
  auto q = torch::ones({4}).requires_grad_(true);
  FusedAdamW fused({p}, torch::optim::AdamWOptions(1e-2).weight_decay(0.0));
  torch::optim::AdamW reference({q}, torch::optim::AdamWOptions(1e-2).weight_decay(0.0));
  const auto m_fused = run(fused, p);
  const auto m_reference = run(reference, q);
  EXPECT_EQ(m_fused.abs().max().item<float>(), 0.0f);
  EXPECT_GT(m_reference.abs().min().item<float>(), 0.0f);  // libtorch keeps the subnormal
  EXPECT_LT(m_reference.abs().max().item<float>(), tiny);
  EXPECT_TRUE(torch::equal(p, q));
}

}  // namespace
