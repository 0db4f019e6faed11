// kernels::group_norm's channels-last CPU node against libtorch's group_norm on the
// same batch in NCHW: values and the gradients of input, weight and bias in
// float64 (to rounding) and float32, group sizes from 1 channel to all of them,
// a mean far from zero, and where it falls back to libtorch.
#include "gradaccum/kernels/group_norm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gradaccum/kernels/custom_kernels.h"
#include "test_support.h"

namespace group_norm_test {

using gradaccum::kernels::group_norm;
using gradaccum::kernels::group_norm_fuses;
using gradaccum::testing::CustomKernelsScope;
using gradaccum::testing::error_of;
using gradaccum::testing::max_relative_difference;
using ::testing::HasSubstr;

struct Gradients {
  torch::Tensor y, x, weight, bias;
};

// y and the gradients of Σ y·dy, with x as given (its layout decides the path).
template <typename F>
Gradients run(F&& norm, const torch::Tensor& x_in, const torch::Tensor& weight_in, const torch::Tensor& bias_in,
              const torch::Tensor& grad_y) {
  auto x = x_in.detach().clone(at::MemoryFormat::Preserve).requires_grad_(true);
  auto weight = weight_in.detach().clone().requires_grad_(true);
  auto bias = bias_in.detach().clone().requires_grad_(true);
  auto y = norm(x, weight, bias);
  (y * grad_y).sum().backward();
  return {y.detach(), x.grad(), weight.grad(), bias.grad()};
}

struct Case {
  int64_t samples, channels, height, width, groups;
};

void expect_matches_libtorch(const Case& c, torch::ScalarType dtype, double tolerance, double offset = 0.0) {
  torch::manual_seed(c.channels * 131 + c.groups);
  const auto options = torch::TensorOptions().dtype(torch::kDouble);
  const auto x64 = torch::randn({c.samples, c.channels, c.height, c.width}, options) * 3.0 + offset;
  const auto weight64 = torch::randn({c.channels}, options);
  const auto bias64 = torch::randn({c.channels}, options);
  const auto grad_y64 = torch::randn({c.samples, c.channels, c.height, c.width}, options);
  // The reference: libtorch's NCHW kernel in float64.
  const auto reference = run([&](const torch::Tensor& x, const torch::Tensor& w,
                                 const torch::Tensor& b) { return torch::group_norm(x, c.groups, w, b, 1e-5); },
                             x64, weight64, bias64, grad_y64);

  const auto x = x64.to(dtype).contiguous(torch::MemoryFormat::ChannelsLast);
  const auto weight = weight64.to(dtype), bias = bias64.to(dtype);
  ASSERT_TRUE(group_norm_fuses(x, c.groups, weight, bias));
  const auto fused = run([&](const torch::Tensor& x, const torch::Tensor& w,
                             const torch::Tensor& b) { return group_norm(x, c.groups, w, b, 1e-5); },
                         x, weight, bias, grad_y64.to(dtype).contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(fused.y.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(fused.x.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_EQ(fused.y.scalar_type(), dtype);
  EXPECT_LT(max_relative_difference(fused.y.to(torch::kDouble), reference.y), tolerance);
  EXPECT_LT(max_relative_difference(fused.x.to(torch::kDouble), reference.x), tolerance);
  EXPECT_LT(max_relative_difference(fused.weight.to(torch::kDouble), reference.weight), tolerance);
  EXPECT_LT(max_relative_difference(fused.bias.to(torch::kDouble), reference.bias), tolerance);
}

// The CNN's two layers (32 channels in 8 groups at 28 × 28, 64 at 14 × 14), a group per
// channel, one group, and shapes whose rows are not a multiple of the vector or block
// length (12 channels in 4 groups, 7 × 9 = 63 and 10 × 13 = 130 pixels).
const std::vector<Case> kCases = {{16, 32, 28, 28, 8}, {4, 64, 14, 14, 8}, {3, 6, 5, 5, 6},
                                  {2, 12, 7, 9, 1},    {5, 12, 10, 13, 4}, {1, 3, 8, 8, 3}};

TEST(GroupNorm, ChannelsLastFloat64EqualsLibtorchToRounding) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(::testing::Message() << c.samples << "x" << c.channels << "x" << c.height << "x" << c.width
                                      << " groups " << c.groups);
    expect_matches_libtorch(c, torch::kDouble, 1e-12);
  }
}

TEST(GroupNorm, ChannelsLastFloat32EqualsFloat64ToFloatRounding) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(::testing::Message() << c.channels << " channels, groups " << c.groups);
    expect_matches_libtorch(c, torch::kFloat, 2e-5);
  }
}

// A mean 1000 times the spread: the variance from squared deviations (two passes) keeps
// float32 accuracy; E[x²] − E[x]² in float32 would have lost it all.
TEST(GroupNorm, MeanFarFromZeroKeepsFloat32Accuracy) {
  expect_matches_libtorch({4, 32, 28, 28, 8}, torch::kFloat, 1e-3, 3000.0);
  expect_matches_libtorch({4, 32, 28, 28, 8}, torch::kDouble, 1e-10, 3000.0);
}

TEST(GroupNorm, OtherInputsRunLibtorchsGroupNorm) {
  torch::manual_seed(3);
  const auto x = torch::randn({4, 16, 6, 6});
  const auto weight = torch::randn({16}), bias = torch::randn({16});
  const auto channels_last = x.contiguous(torch::MemoryFormat::ChannelsLast);
  EXPECT_TRUE(group_norm_fuses(channels_last, 4, weight, bias));
  EXPECT_FALSE(group_norm_fuses(x, 4, weight, bias));                                   // NCHW
  EXPECT_FALSE(group_norm_fuses(channels_last, 4, torch::Tensor(), torch::Tensor()));   // no affine
  EXPECT_FALSE(group_norm_fuses(channels_last.to(torch::kBFloat16), 4, weight, bias));  // dtype
  EXPECT_FALSE(group_norm_fuses(channels_last, 5, weight, bias));                       // 5 ∤ 16
  EXPECT_FALSE(group_norm_fuses(torch::randn({4, 16, 1, 1}), 4, weight, bias));         // both layouts at once
  {
    CustomKernelsScope off("none");
    EXPECT_FALSE(group_norm_fuses(channels_last, 4, weight, bias));
    EXPECT_TRUE(torch::equal(group_norm(channels_last, 4, weight, bias, 1e-5),
                             torch::group_norm(channels_last, 4, weight, bias, 1e-5)));
  }
  // libtorch's own error for groups that do not divide the channels.
  try {
    (void)group_norm(channels_last, 5, weight, bias, 1e-5);
    ADD_FAILURE() << "5 groups of 16 channels were accepted";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("divisible by num_groups"));
  }
}

TEST(GroupNorm, FusedPathIsOneNodeAndRefusesSecondOrderGradients) {
  auto x = torch::randn({2, 8, 4, 4}).contiguous(torch::MemoryFormat::ChannelsLast).requires_grad_(true);
  auto weight = torch::randn({8}, torch::requires_grad()), bias = torch::randn({8}, torch::requires_grad());
  auto h = x * 2.0;
  auto y = group_norm(h, 2, weight, bias, 1e-5);
  ASSERT_TRUE(y.grad_fn());
  EXPECT_THAT(y.grad_fn()->name(), HasSubstr("ChannelsLastGroupNorm"));
  EXPECT_EQ(y.grad_fn()->next_edges()[0].function.get(), h.grad_fn().get());
  EXPECT_THAT(
      error_of([&] { torch::autograd::grad({(y * y).sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true); }),
      HasSubstr("group_norm: the fused channels-last CPU path is not twice differentiable"));
}

}  // namespace group_norm_test
