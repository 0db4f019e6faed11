// kernels/custom_kernels.h: the one switch over the hand-written kernels. Its
// parsing and errors; with it off every kernel's gate is closed and libtorch's
// own path computes the same function (attention through
// at::scaled_dot_product_attention); and a float64 training run is the same
// with the kernels on or off.
#include "gradaccum/kernels/custom_kernels.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "gradaccum/kernels/gelu_tanh.h"
#include "gradaccum/kernels/group_norm.h"
#include "gradaccum/kernels/qkv_attention.h"
#include "gradaccum/models/decoder.h"
#include "gradaccum/models/networks.h"
#include "test_support.h"

namespace custom_kernels_test {

using namespace gradaccum;
using gradaccum::testing::CustomKernelsScope;
using gradaccum::testing::max_relative_difference;
using kernels::CustomKernel;

TEST(CustomKernels, SpecsParseAndUnknownNamesAreOneLineErrors) {
  EXPECT_EQ(kernels::parse_custom_kernels("none").size(), 0u);
  EXPECT_EQ(kernels::parse_custom_kernels("all").size(), kernels::custom_kernel_names().size());
  EXPECT_EQ(kernels::custom_kernel_names().size(), 7u);
  const auto two = kernels::parse_custom_kernels(" gelu_mlp , qkv_attention");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0], kernels::CustomKernel::gelu_mlp);
  EXPECT_EQ(two[1], kernels::CustomKernel::qkv_attention);
  EXPECT_ONE_LINE_ERROR(kernels::parse_custom_kernels("qkv_attention,flash"),
                        "custom_kernels: unknown kernel 'flash' (all | none | names from: qkv_attention, "
                        "gelu_tanh, softmax_cross_entropy, gelu_mlp, heap_retention, group_norm, mkl_intel_path)");
  EXPECT_ONE_LINE_ERROR(kernels::parse_custom_kernels(""), "unknown kernel ''");
}

TEST(CustomKernels, TheSwitchSetsExactlyTheNamedKernelsAndTheScopeRestores) {
  ASSERT_EQ(kernels::custom_kernels_description(),
            "qkv_attention, gelu_tanh, softmax_cross_entropy, gelu_mlp, heap_retention, group_norm, "
            "mkl_intel_path");
  {
    CustomKernelsScope scope("gelu_tanh,heap_retention");
    EXPECT_EQ(kernels::custom_kernels_description(), "gelu_tanh, heap_retention");
    EXPECT_TRUE(kernels::custom_kernel_enabled(kernels::CustomKernel::gelu_tanh));
    EXPECT_FALSE(kernels::custom_kernel_enabled(kernels::CustomKernel::qkv_attention));
    {
      CustomKernelsScope inner("none");
      EXPECT_EQ(kernels::custom_kernels_description(), "none");
      EXPECT_FALSE(kernels::custom_kernel_enabled(kernels::CustomKernel::gelu_tanh));
    }
    EXPECT_EQ(kernels::custom_kernels_description(), "gelu_tanh, heap_retention");
  }
  EXPECT_TRUE(kernels::custom_kernel_enabled(kernels::CustomKernel::qkv_attention));
}

TEST(CustomKernels, OffEveryGateClosesAndLibtorchComputesTheSameFunction) {
  torch::manual_seed(11);
  const int64_t batch = 2, time = 9, channels = 12, n_head = 3;
  auto ids = torch::zeros({batch, time}, torch::kLong);
  auto mask = torch::ones({batch, time}, torch::kLong);
  mask[1].slice(0, 0, 2).zero_();  // left padding: two queries without an allowed key
  const auto allowed = models::causal_attention_allowed(ids, mask);
  const auto qkv = torch::randn({batch, time, 3 * channels}, torch::kDouble);
  const auto x = torch::randn({8, 16}, torch::kDouble);
  models::GeluMlp mlp(16, 32, 1);
  mlp->to(torch::kDouble);
  const auto act = torch::randn({4, 50});
  const auto image = torch::randn({3, 8, 5, 5}, torch::kDouble).contiguous(torch::MemoryFormat::ChannelsLast);
  const auto scale = torch::randn({8}, torch::kDouble), shift = torch::randn({8}, torch::kDouble);

  ASSERT_TRUE(kernels::qkv_attention_fuses(qkv, n_head, allowed));
  ASSERT_TRUE(kernels::gelu_tanh_fuses(act));
  ASSERT_TRUE(mlp->fuses(x));
  ASSERT_TRUE(kernels::group_norm_fuses(image, 4, scale, shift));
  const auto fused_norm = kernels::group_norm(image, 4, scale, shift, 1e-5);
  const auto fused_attention = kernels::qkv_attention(qkv, n_head, allowed);
  const auto fused_mlp = mlp->forward(x);
  const auto fused_gelu = kernels::gelu_tanh(act);

  CustomKernelsScope off("none");
  EXPECT_FALSE(kernels::qkv_attention_fuses(qkv, n_head, allowed));
  EXPECT_FALSE(kernels::gelu_tanh_fuses(act));
  EXPECT_FALSE(mlp->fuses(x));
  EXPECT_FALSE(kernels::group_norm_fuses(image, 4, scale, shift));
  EXPECT_LT(max_relative_difference(kernels::group_norm(image, 4, scale, shift, 1e-5), fused_norm), 1e-12);
  // at::scaled_dot_product_attention, including the rows that attend uniformly.
  const auto sdpa = kernels::qkv_attention(qkv, n_head, allowed);
  EXPECT_LT(max_relative_difference(sdpa, kernels::qkv_attention_reference(qkv, n_head, allowed)), 1e-12);
  EXPECT_LT(max_relative_difference(sdpa, fused_attention), 1e-12);
  const auto v = qkv.slice(2, 2 * channels, 3 * channels);
  EXPECT_LT(max_relative_difference(sdpa[1][0], v[1].mean(0)), 1e-12);
  EXPECT_LT(max_relative_difference(mlp->forward(x), fused_mlp), 1e-12);
  EXPECT_LT(max_relative_difference(kernels::gelu_tanh(act), fused_gelu), 1e-6);
}

// Seed 000's MLP in float64 (the fused MLP node, then libtorch's layers): the same
// trajectory to float64 rounding.
TEST(CustomKernels, AFloat64RunIsTheSameWithTheKernelsOnOrOff) {
  const auto on = gradaccum::testing::train_seed000_mlp(4, 2, 64, 6);
  gradaccum::testing::Trajectory off;
  {
    CustomKernelsScope scope("none");
    off = gradaccum::testing::train_seed000_mlp(4, 2, 64, 6);
  }
  ASSERT_EQ(on.loss.size(), 6u);
  ASSERT_EQ(off.loss.size(), 6u);
  for (size_t i = 0; i < on.loss.size(); ++i) {
    EXPECT_NEAR(on.loss[i], off.loss[i], 1e-12 * std::abs(on.loss[i])) << "step " << i;
    EXPECT_NEAR(on.grad_norm[i], off.grad_norm[i], 1e-10 * on.grad_norm[i]) << "step " << i;
  }
  EXPECT_LT(max_relative_difference(on.weights, off.weights), 1e-10);
  EXPECT_GT(on.loss.front() - on.loss.back(), 0.0);  // it trained
}

TEST(CustomKernels, TheConfigKeyIsCheckedBeforeAnythingIsWritten) {
  const auto dir = gradaccum::testing::make_temp_dir("custom-kernels");
  const auto r =
      gradaccum::testing::run_cli("train --set custom_kernels=gelu_mlp,flash --set output_dir=" + dir + "/out");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("custom_kernels: unknown kernel 'flash'"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/out"));
  std::filesystem::remove_all(dir);
}

}  // namespace custom_kernels_test
