// kernels::gelu_tanh's fused CPU path against libtorch's gelu(x, "tanh"):
// values and slopes in float32, bfloat16 as the float32 result rounded once,
// the fallback for other dtypes, and its refusal of second-order gradients.
#include "gradaccum/kernels/gelu_tanh.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_support.h"

namespace gelu_tanh_test {

using gradaccum::kernels::gelu_tanh;
using gradaccum::kernels::gelu_tanh_fuses;
using gradaccum::testing::error_of;
using gradaccum::testing::max_relative_difference;
using gradaccum::testing::value_and_grad;
using ::testing::HasSubstr;

// Every regime: large negative (gelu → 0), around zero, large positive (gelu → x), and
// enough elements (100,003) for several parallel tasks and a remainder after the vector lanes.
torch::Tensor inputs(torch::ScalarType dtype) {
  torch::manual_seed(4);
  return torch::cat({torch::linspace(-12.0, 12.0, 50001), torch::randn({50002}) * 3.0}).to(dtype);
}

torch::Tensor libtorch_gelu(const torch::Tensor& x) { return torch::gelu(x, "tanh"); }

TEST(GeluTanh, Float32MatchesLibtorchToRounding) {
  const auto x = inputs(torch::kFloat);
  ASSERT_TRUE(gelu_tanh_fuses(x));
  const auto fused = value_and_grad([](const torch::Tensor& t) { return gelu_tanh(t); }, x);
  const auto reference = value_and_grad(libtorch_gelu, x);
  EXPECT_LT(max_relative_difference(fused.value, reference.value), 1e-6);
  EXPECT_LT(max_relative_difference(fused.grad, reference.grad), 1e-6);
  // Against float64 element by element, down to values of 1e-9 (x ≈ −6), where float32's
  // 1 + tanh(u) = 1 − 0.99999999… would have cancelled to nothing (float64's own formula
  // cancels too, below ~1e-13).
  const auto exact = torch::gelu(x.to(torch::kDouble), "tanh");
  const auto shown = exact.abs().gt(1e-9);
  const auto relative = ((fused.value.to(torch::kDouble) - exact).abs() / exact.abs()).masked_select(shown);
  // (The tail's relative condition number, ~2|u| ≈ 30 at x = −6, scales float32's rounding of u.)
  EXPECT_LT(relative.max().item<double>(), 1e-5);
}

TEST(GeluTanh, BFloat16IsTheFloat32ResultRoundedOnce) {
  const auto x = inputs(torch::kBFloat16);
  ASSERT_TRUE(gelu_tanh_fuses(x));
  const auto fused = value_and_grad([](const torch::Tensor& t) { return gelu_tanh(t); }, x);
  const auto float32 =
      value_and_grad([](const torch::Tensor& t) { return gelu_tanh(t.to(torch::kFloat)).to(torch::kBFloat16); }, x);
  EXPECT_EQ(fused.value.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(fused.grad.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(fused.value, float32.value));
  EXPECT_TRUE(torch::equal(fused.grad, float32.grad));
}

TEST(GeluTanh, OtherInputsRunLibtorchsGelu) {
  const auto x = inputs(torch::kDouble);
  EXPECT_FALSE(gelu_tanh_fuses(x));
  EXPECT_FALSE(gelu_tanh_fuses(inputs(torch::kFloat).narrow(0, 0, 100002).view({-1, 2}).t()));
  const auto fallback = value_and_grad([](const torch::Tensor& t) { return gelu_tanh(t); }, x);
  const auto reference = value_and_grad(libtorch_gelu, x);
  EXPECT_TRUE(torch::equal(fallback.value, reference.value));
  EXPECT_TRUE(torch::equal(fallback.grad, reference.grad));
}

TEST(GeluTanh, FusedPathIsOneNodeAndRefusesSecondOrderGradients) {
  auto x = torch::randn({4, 6}, torch::requires_grad());
  auto h = x * 2.0;
  auto y = gelu_tanh(h);
  ASSERT_TRUE(y.grad_fn());
  EXPECT_THAT(y.grad_fn()->name(), HasSubstr("FusedGeluTanh"));
  EXPECT_EQ(y.grad_fn()->next_edges()[0].function.get(), h.grad_fn().get());
  EXPECT_THAT(error_of([&] {
                torch::autograd::grad({y.sum()}, {x}, {}, /*retain_graph=*/true,
                                      /*create_graph=*/true);
              }),
              HasSubstr("gelu_tanh: the fused CPU path is not twice differentiable"));
}

}  // namespace gelu_tanh_test
