// kernels::softmax_cross_entropy_ against libtorch's log_softmax, gather and
// exp: the loss and the gradient softmax − onehot, weighted rows, bfloat16
// rounding, thread-count independence and its errors; and SoftmaxCrossEntropySum,
// which runs it or libtorch's path per block.
#include "gradaccum/kernels/softmax_cross_entropy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "gradaccum/kernels/custom_kernels.h"
#include "test_support.h"

namespace softmax_cross_entropy_test {

using gradaccum::kernels::softmax_cross_entropy_;
using gradaccum::kernels::softmax_cross_entropy_supports;
using gradaccum::kernels::SoftmaxCrossEntropySum;
using gradaccum::testing::error_of;
using gradaccum::testing::max_relative_difference;
using ::testing::HasSubstr;

struct Reference {
  double loss;
  torch::Tensor grad;  // float64
};

// Σ_r w_r · (−log softmax(x_r)[t_r]) and w_r · (softmax(x_r) − onehot(t_r)) in float64, by libtorch.
Reference reference(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& weights) {
  const auto x = logits.to(torch::kDouble);
  const auto w = weights.defined() ? weights.to(torch::kDouble) : torch::ones({x.size(0)}, x.options());
  const auto log_p = torch::log_softmax(x, 1);
  const auto picked = log_p.gather(1, targets.unsqueeze(1)).squeeze(1);
  auto grad = log_p.exp() - torch::one_hot(targets, x.size(1)).to(torch::kDouble);
  return {-(picked * w).sum().item<double>(), grad * w.unsqueeze(1)};
}

// Logits spread like a language model's: most near zero, a few large, over 8192 columns
// (a multiple of the 16 lanes) or 37 (a remainder of 5).
torch::Tensor logits_of(int64_t rows, int64_t vocab, torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  return (torch::randn({rows, vocab}, torch::kDouble) * 3.0).to(dtype);
}

TEST(SoftmaxCrossEntropy, Float64EqualsLibtorchToRounding) {
  for (const int64_t vocab : {37, 8192}) {
    const auto logits = logits_of(6, vocab, torch::kDouble, 1);
    const auto targets = torch::tensor(std::vector<int64_t>{0, vocab - 1, 3, 17, 5, 2});
    const auto expected = reference(logits, targets, {});
    auto inplace = logits.clone();
    const double loss = softmax_cross_entropy_(inplace, targets, {});
    EXPECT_NEAR(loss, expected.loss, 1e-12 * std::abs(expected.loss)) << "vocab " << vocab;
    EXPECT_LT(max_relative_difference(inplace, expected.grad), 1e-13) << "vocab " << vocab;
  }
}

TEST(SoftmaxCrossEntropy, Float32IsWithinFloatRoundingOfFloat64) {
  for (const int64_t vocab : {37, 8192}) {
    const auto logits = logits_of(64, vocab, torch::kFloat, 2);
    const auto targets = torch::randint(vocab, {64}, torch::kLong);
    const auto expected = reference(logits, targets, {});
    auto inplace = logits.clone();
    const double loss = softmax_cross_entropy_(inplace, targets, {});
    EXPECT_LT(std::abs(loss - expected.loss) / expected.loss, 1e-6) << "vocab " << vocab;
    // The gradient's entries are ≤ 1 in magnitude; float32 rounding of the exponentials and the
    // sum leaves ~1e-7 of the largest.
    EXPECT_LT(max_relative_difference(inplace.to(torch::kDouble), expected.grad), 2e-6) << "vocab " << vocab;
    // Every row of a softmax gradient sums to 0 (to float32 rounding of 8192 terms).
    EXPECT_LT(inplace.to(torch::kDouble).sum(1).abs().max().item<double>(), 1e-5);
  }
}

TEST(SoftmaxCrossEntropy, WeightedRowsScaleAndZeroRowsVanishEvenWhenNotFinite) {
  auto logits = logits_of(4, 100, torch::kFloat, 3);
  logits[1].fill_(std::numeric_limits<float>::quiet_NaN());  // a padding row of garbage
  logits[3][7] = std::numeric_limits<float>::infinity();
  const auto targets = torch::tensor({4, 9, 99, 0}, torch::kLong);
  const auto weights = torch::tensor({1.0f, 0.0f, 0.5f, 0.0f});
  auto finite = logits.clone();
  finite[1].zero_();
  finite[3].zero_();
  const auto expected = reference(finite, targets, weights);
  auto inplace = logits.clone();
  const double loss = softmax_cross_entropy_(inplace, targets, weights);
  EXPECT_LT(std::abs(loss - expected.loss) / expected.loss, 1e-6);
  EXPECT_LT(max_relative_difference(inplace.to(torch::kDouble), expected.grad), 2e-6);
  EXPECT_EQ(inplace[1].abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(inplace[3].abs().sum().item<float>(), 0.0f);
}

TEST(SoftmaxCrossEntropy, BFloat16GradientIsTheFloat32OneRoundedOnce) {
  const int64_t vocab = 8192;
  const auto logits = logits_of(32, vocab, torch::kBFloat16, 4);
  const auto targets = torch::randint(vocab, {32}, torch::kLong);
  const auto expected = reference(logits, targets, {});  // of the bfloat16 values, in float64
  auto inplace = logits.clone();
  const double loss = softmax_cross_entropy_(inplace, targets, {});
  ASSERT_EQ(inplace.scalar_type(), torch::kBFloat16);
  EXPECT_LT(std::abs(loss - expected.loss) / expected.loss, 1e-6);
  // Rounding once to bfloat16 (8 significant bits) leaves at most half a unit in the last place,
  // at most 2^-8 of the entry; the float32 arithmetic before it adds ~1e-7.
  const auto got = inplace.to(torch::kDouble);
  const auto error = (got - expected.grad).abs();
  const auto allowed = expected.grad.abs() * (std::ldexp(1.0, -8) + 1e-6) + 1e-30;
  EXPECT_TRUE(error.le(allowed).all().item<bool>()) << "worst excess " << (error - allowed).max().item<double>();
  // And it is what rounding the float32 kernel's gradient gives, for all but a few entries that
  // sit on a rounding boundary.
  auto as_float = logits.to(torch::kFloat);
  softmax_cross_entropy_(as_float, targets, {});
  const auto mismatches = inplace.ne(as_float.to(torch::kBFloat16)).sum().item<int64_t>();
  EXPECT_LE(mismatches, 32 * vocab / 1000) << mismatches << " of " << 32 * vocab;
}

TEST(SoftmaxCrossEntropy, ExtremeLogitsGiveFiniteExactGradients) {
  // One logit dominates by 1000: every other probability underflows (the kernel's floor is
  // e^-87 ≈ 1.6e-38), the loss of the dominant target is 0 and of another ~1000.
  auto logits = torch::zeros({2, 64});
  logits.select(1, 5).fill_(1000.0f);
  logits[1][60] = -1e30f;
  const auto targets = torch::tensor({5, 6}, torch::kLong);
  auto inplace = logits.clone();
  const double loss = softmax_cross_entropy_(inplace, targets, {});
  EXPECT_NEAR(loss, 1000.0, 1e-3);
  EXPECT_TRUE(torch::isfinite(inplace).all().item<bool>());
  EXPECT_NEAR(inplace.abs().sum().item<double>(), 2.0, 1e-6);  // row 1: p_5 = 1, p_6 − 1 = −1
  EXPECT_NEAR(inplace[1][6].item<float>(), -1.0f, 1e-6);
  EXPECT_NEAR(inplace[1][5].item<float>(), 1.0f, 1e-6);
  EXPECT_LE(inplace[0].abs().max().item<float>(), 1e-30f);
}

TEST(SoftmaxCrossEntropy, ResultDoesNotDependOnTheThreadCount) {
  const auto logits = logits_of(257, 1000, torch::kFloat, 5);
  const auto targets = torch::randint(1000, {257}, torch::kLong);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto one = logits.clone();
  const double loss_one = softmax_cross_entropy_(one, targets, {});
  at::set_num_threads(2);
  auto two = logits.clone();
  const double loss_two = softmax_cross_entropy_(two, targets, {});
  at::set_num_threads(threads);
  EXPECT_EQ(loss_one, loss_two);
  EXPECT_TRUE(one.equal(two));
}

TEST(SoftmaxCrossEntropy, RefusesWhatItDoesNotTake) {
  auto logits = torch::zeros({3, 10});
  const auto targets = torch::tensor({1, 10, 2}, torch::kLong);
  EXPECT_THAT(error_of([&] { softmax_cross_entropy_(logits, targets, {}); }),
              HasSubstr("softmax cross-entropy: target 10 of row 1 is outside the vocabulary [0, 10)"));
  auto transposed = torch::zeros({10, 3}).t();
  EXPECT_FALSE(softmax_cross_entropy_supports(transposed));
  EXPECT_THAT(error_of([&] { softmax_cross_entropy_(transposed, targets, {}); }),
              HasSubstr("logits must be a contiguous 2-D float32, bfloat16 or float64 CPU tensor, "
                        "got a cpu Float tensor of 2 dimension(s), not contiguous"));
  auto half = torch::zeros({3, 10}, torch::kHalf);
  EXPECT_FALSE(softmax_cross_entropy_supports(half));
  const auto good_targets = torch::tensor({1, 2, 3}, torch::kLong);
  EXPECT_THAT(error_of([&] { softmax_cross_entropy_(logits, good_targets, torch::ones({2})); }),
              HasSubstr("row weights must be a float32 or float64 CPU tensor of 3 row(s)"));
  EXPECT_THAT(error_of([&] { softmax_cross_entropy_(logits, good_targets.to(torch::kInt), {}); }),
              HasSubstr("targets must be a CPU int64 tensor of 3 row(s)"));
  // A refused call leaves the logits untouched.
  EXPECT_EQ(logits.abs().sum().item<float>(), 0.0f);
}

// Two blocks, weighted and not, through the kernel and (switch off, or float16 logits the kernel
// does not take) through libtorch: the same sum and gradients, in the logits' dtype.
TEST(SoftmaxCrossEntropySum, KernelAndLibtorchPathsGiveTheSameSumAndGradients) {
  const auto first = logits_of(5, 37, torch::kDouble, 6), second = logits_of(3, 37, torch::kDouble, 7);
  const auto first_targets = torch::tensor({0, 36, 4, 9, 1}, torch::kLong);
  const auto second_targets = torch::tensor({2, 3, 5}, torch::kLong);
  const auto weights = torch::tensor({1.0, 0.0, 0.5}, torch::kDouble);
  const auto a = reference(first, first_targets, {}), b = reference(second, second_targets, weights);
  for (const auto* spec : {"all", "none"}) {
    SCOPED_TRACE(spec);
    const gradaccum::testing::CustomKernelsScope scope(spec);
    SoftmaxCrossEntropySum sum(torch::TensorOptions().dtype(torch::kDouble));
    auto x = first.clone(), y = second.clone();
    const auto grad_x = sum.add(x, first_targets, {}, true);
    const auto grad_y = sum.add(y, second_targets, weights, true);
    EXPECT_EQ(x.data_ptr() == grad_x.data_ptr(), std::string(spec) == "all");  // in place: the kernel ran
    EXPECT_LT(max_relative_difference(grad_x, a.grad), 1e-13);
    EXPECT_LT(max_relative_difference(grad_y, b.grad), 1e-13);
    const auto total = sum.sum();
    ASSERT_EQ(total.dim(), 0);
    EXPECT_NEAR(total.item<double>(), a.loss + b.loss, 1e-12 * (a.loss + b.loss));
  }
  // float16 logits: libtorch's path in float32, the gradient back in float16; none without `gradient`.
  SoftmaxCrossEntropySum sum(torch::TensorOptions().dtype(torch::kFloat));
  auto half = first.to(torch::kHalf);
  const auto expected = reference(half, first_targets, {});
  const auto grad = sum.add(half, first_targets, {}, true);
  EXPECT_EQ(grad.scalar_type(), torch::kHalf);
  EXPECT_LT(max_relative_difference(grad.to(torch::kDouble), expected.grad), 1e-3);
  EXPECT_FALSE(sum.add(half, first_targets, {}, false).defined());
  EXPECT_NEAR(sum.sum().item<double>(), 2 * expected.loss, 1e-5 * expected.loss);
}

}  // namespace softmax_cross_entropy_test
