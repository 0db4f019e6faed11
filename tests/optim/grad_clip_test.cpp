#include "gradaccum/optim/grad_clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace grad_clip_test {

using gradaccum::optim::clip_grad_norm;
using gradaccum::optim::global_weight_norm;

// The float64 norm of float64 copies: what the norms must equal.
double reference_norm(const std::vector<torch::Tensor>& tensors) {
  double squares = 0.0;
  for (const auto& t : tensors) squares += t.to(torch::kDouble).square().sum().item<double>();
  return std::sqrt(squares);
}

double relative_error(double got, double want) { return std::abs(got - want) / std::abs(want); }

TEST(GradClip, Float32NormsEqualFloat64AcrossShapesThatSplitIntoRowsAndTails) {
  torch::manual_seed(5);
  // A GPT-sized embedding (1.5M elements, where one float32 reduction is ~2e-5 off), a
  // tensor of whole 1024-element rows, one with a 1023-element tail, and a bias.
  std::vector<torch::Tensor> tensors = {torch::randn({8192, 192}) * 1e-3 + 1e-3, torch::randn({4, 1024}),
                                        torch::randn({3, 1365}), torch::randn({192})};
  const auto norm = global_weight_norm(tensors);
  EXPECT_EQ(norm.scalar_type(), torch::kDouble);
  EXPECT_EQ(norm.dim(), 0);
  EXPECT_LT(relative_error(norm.item<double>(), reference_norm(tensors)), 1e-8);
  // The embedding alone, where a single float32 norm fails this bound.
  const std::vector<torch::Tensor> embedding = {tensors[0]};
  EXPECT_LT(relative_error(global_weight_norm(embedding).item<double>(), reference_norm(embedding)), 1e-8);
  EXPECT_GT(relative_error(torch::linalg_vector_norm(tensors[0], 2).item<double>(), reference_norm(embedding)), 1e-7);
}

TEST(GradClip, SquaresBeyondFloat32sRangeAreTakenInFloat64) {
  // 1e25² overflows float32 and 1e-25² underflows it; the norms are still float64's.
  const std::vector<torch::Tensor> huge = {torch::full({3000}, 1e25f), torch::randn({100})};
  EXPECT_LT(relative_error(global_weight_norm(huge).item<double>(), reference_norm(huge)), 1e-12);
  const std::vector<torch::Tensor> tiny = {torch::full({3000}, 1e-25f)};
  EXPECT_LT(relative_error(global_weight_norm(tiny).item<double>(), reference_norm(tiny)), 1e-12);
  // An all-zero tensor adds nothing; none at all is a norm of 0.
  EXPECT_EQ(global_weight_norm({torch::zeros({2048})}).item<double>(), 0.0);
  EXPECT_EQ(global_weight_norm({}).item<double>(), 0.0);
}

TEST(GradClip, ClipScalesEveryGradientByMaxNormOverTheNorm) {
  auto a = torch::zeros({3}, torch::requires_grad());
  auto b = torch::zeros({2}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 0.0f, 0.0f});
  b.mutable_grad() = torch::tensor({0.0f, 4.0f});
  const auto result = clip_grad_norm({a, b}, 1.0);
  EXPECT_DOUBLE_EQ(result.norm_before.item<double>(), 5.0);
  const double factor = 1.0 / (5.0 + 1e-6);  // PyTorch's clip_grad_norm_ coefficient
  EXPECT_NEAR(result.norm_after.item<double>(), 5.0 * factor, 1e-12);
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), static_cast<float>(3.0 * factor));
  EXPECT_FLOAT_EQ(b.grad()[1].item<float>(), static_cast<float>(4.0 * factor));
  // Under max_norm nothing moves.
  const auto unclipped = clip_grad_norm({a, b}, 10.0);
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), static_cast<float>(3.0 * factor));
  EXPECT_NEAR(unclipped.norm_after.item<double>(), unclipped.norm_before.item<double>(), 0.0);
}

}  // namespace grad_clip_test
