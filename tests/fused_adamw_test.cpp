// optim::FusedAdamW (libtorch's at::_fused_adamw_) against torch::optim::AdamW:
// the same trajectory to rounding, amsgrad included, and bit for bit where it
// takes torch::optim::AdamW's operators (non-contiguous tensors).
#include <gtest/gtest.h>

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

}  // namespace
