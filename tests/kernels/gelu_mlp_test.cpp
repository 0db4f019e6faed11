// GeluMlp: the fused CPU path against libtorch's own Linear → GELU → Linear,
// against central finite differences, and which inputs take which path.
#include "gradaccum/kernels/gelu_mlp.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <string>

#include "dtype_cases.h"
#include "gradaccum/models/networks.h"
#include "test_support.h"

namespace gelu_mlp_test {

using gradaccum::models::GeluMlp;
using gradaccum::testing::max_relative_difference;

// A GeluMlp and the Sequential with the same weights, both in `dtype`.
struct Pair {
  GeluMlp fused{nullptr};
  torch::nn::Sequential plain{nullptr};
};

Pair make_pair(int64_t in, int64_t hidden, int64_t out, torch::ScalarType dtype) {
  torch::manual_seed(7);
  Pair p{GeluMlp(in, hidden, out), nullptr};
  p.plain = torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::GELU(), torch::nn::Linear(hidden, out));
  p.fused->to(dtype);
  p.plain->to(dtype);
  torch::NoGradGuard no_grad;
  for (const auto& item : p.plain->named_parameters()) {
    item.value().copy_(p.fused->named_parameters()[item.key()]);
  }
  return p;
}

struct Result {
  torch::Tensor y, grad_x, grads;
};

// Forward, backward of a weighted sum (every output element gets its own
// gradient), and the gradients of x and of every parameter in named order.
Result run(torch::nn::Module& module, const std::function<torch::Tensor(torch::Tensor)>& forward,
           const torch::Tensor& x_in, const torch::Tensor& weights) {
  module.zero_grad();
  auto x = x_in.clone().requires_grad_(true);
  auto y = forward(x);
  (y * weights).sum().backward();
  return {y.detach(), x.grad(), gradaccum::testing::flat_grads(module)};
}

void expect_fused_equals_plain(torch::ScalarType dtype, double tolerance) {
  for (const int64_t rows : {1, 3, 8}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    auto p = make_pair(16, 32, 2, dtype);
    torch::manual_seed(rows);
    const auto x = torch::randn({rows, 16}, dtype);
    const auto weights = torch::randn({rows, 2}, dtype);
    ASSERT_TRUE(p.fused->fuses(x));
    const auto fused = run(
        *p.fused, [&](const torch::Tensor& t) { return p.fused(t); }, x, weights);
    const auto plain = run(
        *p.plain, [&](const torch::Tensor& t) { return p.plain->forward(t); }, x, weights);
    EXPECT_LE(max_relative_difference(fused.y, plain.y), tolerance);
    EXPECT_LE(max_relative_difference(fused.grad_x, plain.grad_x), tolerance);
    EXPECT_LE(max_relative_difference(fused.grads, plain.grads), tolerance);
    EXPECT_GT(fused.grads.abs().sum().item<double>(), 0.0);
  }
}

class GeluMlpDtypes : public ::testing::TestWithParam<gradaccum::testing::DtypeCase> {};

TEST_P(GeluMlpDtypes, FusedPathEqualsLibtorchLayers) {
  expect_fused_equals_plain(GetParam().dtype, GetParam().tolerance);
}

INSTANTIATE_TEST_SUITE_P(, GeluMlpDtypes, gradaccum::testing::dtype_cases(1e-12, 1e-5),
                         gradaccum::testing::dtype_case_name);

// Same parameter names and, from the same seed, the same initial weights as
// the Sequential of seed 000, so golden files and checkpoints fit both.
TEST(GeluMlp, NamesAndInitializationMatchTheSequential) {
  torch::manual_seed(11);
  auto fused = gradaccum::models::seed000_mlp();
  torch::manual_seed(11);
  auto plain = gradaccum::models::seed000_sequential_mlp();
  const auto a = fused->named_parameters();
  const auto b = plain->named_parameters();
  ASSERT_EQ(a.keys(), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& key : a.keys()) EXPECT_TRUE(torch::equal(a[key], b[key])) << key;
}

// The fused backward against central differences of the fused forward, at
// every element of x and of every parameter (float64).
TEST(GeluMlp, FusedGradientsMatchFiniteDifferences) {
  auto p = make_pair(5, 7, 3, torch::kDouble);
  torch::manual_seed(3);
  const auto x = torch::randn({4, 5}, torch::kDouble);
  const auto weights = torch::randn({4, 3}, torch::kDouble);
  const auto analytic = run(
      *p.fused, [&](const torch::Tensor& t) { return p.fused(t); }, x, weights);
  auto objective = [&](const torch::Tensor& input) {
    torch::NoGradGuard no_grad;
    return (p.fused(input) * weights).sum().item<double>();
  };
  const double eps = 1e-6;
  auto numeric_of = [&](torch::Tensor target, const std::function<double()>& f) {
    auto grad = torch::zeros({target.numel()}, torch::kDouble);
    torch::NoGradGuard no_grad;
    auto flat = target.view({-1});
    for (int64_t i = 0; i < target.numel(); ++i) {
      const double saved = flat[i].item<double>();
      flat[i] = saved + eps;
      const double up = f();
      flat[i] = saved - eps;
      const double down = f();
      flat[i] = saved;
      grad[i] = (up - down) / (2 * eps);
    }
    return grad;
  };
  auto x_copy = x.clone();
  const auto numeric_x = numeric_of(x_copy, [&] { return objective(x_copy); });
  EXPECT_LE(max_relative_difference(analytic.grad_x.reshape(-1), numeric_x), 1e-7);
  std::vector<torch::Tensor> numeric_params;
  for (auto& param : p.fused->parameters()) {
    numeric_params.push_back(numeric_of(param, [&] { return objective(x); }));
  }
  EXPECT_LE(max_relative_difference(analytic.grads, torch::cat(numeric_params)), 1e-7);
}

// The fused path is one autograd node whose edges lead straight to the four
// parameters' accumulators: that is what it is for.
TEST(GeluMlp, FusedPathIsOneAutogradNode) {
  auto mlp = gradaccum::models::seed000_mlp();
  const auto y = mlp(torch::randn({1, 16}));
  ASSERT_TRUE(y.grad_fn());
  const auto& edges = y.grad_fn()->next_edges();
  ASSERT_EQ(edges.size(), 5u);
  EXPECT_FALSE(edges[0].is_valid());  // x needs no gradient
  for (size_t i = 1; i < edges.size(); ++i) {
    ASSERT_TRUE(edges[i].is_valid());
    EXPECT_NE(edges[i].function->name().find("AccumulateGrad"), std::string::npos) << i;
  }
  // The unfused path goes through libtorch's nodes (an addmm first).
  auto plain = gradaccum::models::seed000_sequential_mlp();
  EXPECT_NE(plain->forward(torch::randn({1, 16})).grad_fn()->name().find("Addmm"), std::string::npos);
}

TEST(GeluMlp, LargeNonContiguousOrReducedPrecisionInputsTakeLibtorchLayers) {
  auto mlp = GeluMlp(16, 32, 1);
  const int64_t per_row = 16 * 32 + 32 * 1;
  const int64_t most_rows = GeluMlp::Impl::kMaxFusedMultiplyAdds / per_row;
  EXPECT_TRUE(mlp->fuses(torch::randn({most_rows, 16})));
  EXPECT_FALSE(mlp->fuses(torch::randn({most_rows + 1, 16})));
  EXPECT_FALSE(mlp->fuses(torch::randn({16, 4}).t()));              // not contiguous
  EXPECT_FALSE(mlp->fuses(torch::randn({2, 3, 16})));               // not a matrix
  EXPECT_FALSE(mlp->fuses(torch::randn({2, 16}, torch::kDouble)));  // weights are float32
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    const bool under_autocast = mlp->fuses(torch::randn({2, 16}));
    at::autocast::set_autocast_enabled(at::kCPU, false);
    EXPECT_FALSE(under_autocast);
  }
  // Both paths compute the same function: the largest fused input against
  // the same rows plus one, which takes the libtorch layers.
  torch::manual_seed(5);
  const auto x = torch::randn({most_rows + 1, 16});
  torch::NoGradGuard no_grad;
  const auto unfused = mlp(x);
  const auto fused = mlp(x.slice(0, 0, most_rows));
  EXPECT_LE(max_relative_difference(fused, unfused.slice(0, 0, most_rows)), 1e-5);
}

TEST(GeluMlp, NoGraphUnderNoGradAndAClearErrorForASecondDerivative) {
  auto mlp = gradaccum::models::seed000_mlp();
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(mlp(torch::randn({2, 16})).requires_grad());
  }
  const auto y = mlp(torch::randn({2, 16})).sum();
  try {
    torch::autograd::grad({y}, mlp->parameters(), {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not twice differentiable"), std::string::npos) << e.what();
  }
}

}  // namespace gelu_mlp_test
