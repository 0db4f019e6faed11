// kernels::qkv_attention's fused CPU path against the libtorch expression it
// replaces (qkv_attention_reference): outputs and gradients with causal and
// padding masks, both packings of qkv and a key bias, rows with no allowed key,
// which inputs fuse, and its errors.
#include "gradaccum/kernels/qkv_attention.h"

#include <ATen/autocast_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gradaccum/models/decoder.h"
#include "test_support.h"

namespace qkv_attention_test {

using gradaccum::kernels::qkv_attention;
using gradaccum::kernels::qkv_attention_fuses;
using gradaccum::kernels::qkv_attention_reference;
using gradaccum::kernels::qkv_attention_sdpa;
using gradaccum::kernels::QkvAttentionOptions;
using gradaccum::kernels::QkvPacking;
using gradaccum::models::causal_attention_allowed;
using gradaccum::testing::error_of;
using gradaccum::testing::max_relative_difference;
using gradaccum::testing::value_and_grad;
using gradaccum::testing::ValueAndGrad;
using ::testing::HasSubstr;

// The output and d(Σ y ⊙ w)/d qkv of `attention` (test_support.h's value_and_grad).
template <typename Attention>
ValueAndGrad run(Attention attention, const torch::Tensor& qkv, const torch::Tensor& allowed, int64_t n_head,
                 const QkvAttentionOptions& options = {}) {
  return value_and_grad([&](const torch::Tensor& x) { return attention(x, n_head, allowed, options); }, qkv);
}

// Masks: causal for all rows ([1, 1, T, T]); causal ∧ real key with right padding (row 0
// has 3 padding tokens) and left padding (row 1's first 2 tokens are padding, so its
// first two queries have no allowed key and attend uniformly).
std::vector<torch::Tensor> masks(int64_t batch, int64_t time) {
  auto ids = torch::zeros({batch, time}, torch::kLong);
  auto attention_mask = torch::ones({batch, time}, torch::kLong);
  attention_mask[0].slice(0, time - 3, time).zero_();
  attention_mask[1].slice(0, 0, 2).zero_();
  return {causal_attention_allowed(ids, {}), causal_attention_allowed(ids, attention_mask)};
}

// GPT-2's packing without a bias; BLOOM's packing with and without an ALiBi-like key bias
// (per sample and per head, or shared by the batch).
std::vector<QkvAttentionOptions> option_sets(int64_t batch, int64_t n_head, int64_t time, torch::ScalarType dtype) {
  const auto per_sample = torch::randn({batch, n_head, 1, time}, dtype) * 3.0;
  const auto shared = torch::randn({1, n_head, 1, time}, dtype) * 3.0;
  return {{QkvPacking::by_part, {}},
          {QkvPacking::by_head, {}},
          {QkvPacking::by_head, per_sample},
          {QkvPacking::by_part, shared}};
}

void expect_fused_equals_reference(torch::ScalarType dtype, double tolerance) {
  for (const int64_t time : {7, 40, 100, 600}) {  // query blocks: 1 and 2 of 32 rows, 7 of 16, 10 of 64
    for (const auto& allowed : masks(3, time)) {
      torch::manual_seed(5);
      const int64_t n_head = 3, channels = 24;
      const auto qkv = torch::randn({3, time, 3 * channels}, dtype) * 2.0;
      for (const auto& options : option_sets(3, n_head, time, dtype)) {
        ASSERT_TRUE(qkv_attention_fuses(qkv, n_head, allowed, options));
        const auto fused = run(qkv_attention, qkv, allowed, n_head, options);
        const auto reference = run(qkv_attention_reference, qkv, allowed, n_head, options);
        const auto where = ::testing::Message() << "T " << time << ", mask " << allowed.sizes() << ", packing "
                                                << static_cast<int>(options.packing) << ", bias "
                                                << (options.key_bias.defined() ? options.key_bias.size(0) : 0);
        EXPECT_LT(max_relative_difference(fused.value, reference.value), tolerance) << where;
        EXPECT_LT(max_relative_difference(fused.grad, reference.grad), tolerance) << where;
        EXPECT_GT(reference.grad.abs().max().item<double>(), 0.1);  // the comparison has substance
      }
    }
  }
}

TEST(QkvAttention, FusedEqualsTheLibtorchExpressionInFloat64) { expect_fused_equals_reference(torch::kDouble, 1e-12); }

TEST(QkvAttention, FusedEqualsTheLibtorchExpressionInFloat32) { expect_fused_equals_reference(torch::kFloat, 2e-6); }

// BLOOM's packing is GPT-2's with each head's q, k and v gathered: the same attention of
// the same heads, and a key bias moves the result (it is read).
TEST(QkvAttention, PackingByHeadIsByPartWithTheHeadsGathered) {
  const int64_t batch = 2, time = 37, n_head = 4, head_dim = 8, channels = n_head * head_dim;
  const auto allowed = masks(batch, time)[1];
  torch::manual_seed(11);
  const auto by_head = torch::randn({batch, time, 3 * channels}, torch::kDouble);
  const auto by_part = by_head.view({batch, time, n_head, 3, head_dim})
                           .permute({0, 1, 3, 2, 4})
                           .reshape({batch, time, 3 * channels})
                           .contiguous();
  const auto bias = torch::randn({batch, n_head, 1, time}, torch::kDouble);
  const auto a = qkv_attention(by_head, n_head, allowed, {QkvPacking::by_head, bias});
  const auto b = qkv_attention(by_part, n_head, allowed, {QkvPacking::by_part, bias});
  EXPECT_LT(max_relative_difference(a, b), 1e-15);
  const auto unbiased = qkv_attention(by_head, n_head, allowed, {QkvPacking::by_head, {}});
  EXPECT_GT((a - unbiased).abs().max().item<double>(), 1e-2);
  // libtorch's attention reads the same packing and bias.
  EXPECT_LT(max_relative_difference(qkv_attention_sdpa(by_head, n_head, allowed, {QkvPacking::by_head, bias}), a),
            1e-12);
}

TEST(QkvAttention, RowsWithoutAllowedKeysAttendUniformly) {
  const int64_t time = 5, channels = 4;
  const auto allowed = masks(2, time)[1];  // row 1: queries 0 and 1 see only padding
  const auto qkv = torch::randn({2, time, 3 * channels}, torch::kDouble);
  const auto y = qkv_attention(qkv, 1, allowed);
  const auto v = qkv.slice(2, 2 * channels, 3 * channels);
  const auto mean_v = v[1].mean(0);
  EXPECT_LT(max_relative_difference(y[1][0], mean_v), 1e-14);
  EXPECT_LT(max_relative_difference(y[1][1], mean_v), 1e-14);
  // Query 2 of row 1 sees only key 2.
  EXPECT_LT(max_relative_difference(y[1][2], v[1][2]), 1e-14);
}

TEST(QkvAttention, IsOneAutogradNodeFeedingQkv) {
  const auto allowed = masks(2, 6)[0];
  auto x = torch::randn({2, 6, 12}, torch::requires_grad());
  auto qkv = x * 2.0;
  auto y = qkv_attention(qkv, 2, allowed);
  ASSERT_TRUE(y.grad_fn());
  const auto& edges = y.grad_fn()->next_edges();
  // qkv, then allowed and n_head, which take no gradient.
  ASSERT_GE(edges.size(), 1u);
  EXPECT_EQ(edges[0].function.get(), qkv.grad_fn().get());
}

TEST(QkvAttention, WhichInputsFuse) {
  const auto allowed = masks(2, 6)[0];
  const auto qkv = torch::randn({2, 6, 12});
  EXPECT_TRUE(qkv_attention_fuses(qkv, 2, allowed));
  EXPECT_FALSE(qkv_attention_fuses(qkv.to(torch::kBFloat16), 2, allowed));
  EXPECT_FALSE(qkv_attention_fuses(qkv.transpose(0, 1).contiguous().transpose(0, 1), 2, allowed));
  at::autocast::set_autocast_enabled(at::kCUDA, true);  // CUDA autocast: irrelevant to a CPU tensor
  EXPECT_TRUE(qkv_attention_fuses(qkv, 2, allowed));
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  EXPECT_FALSE(qkv_attention_fuses(qkv, 2, allowed));
  EXPECT_TRUE(qkv_attention_fuses(qkv.to(torch::kBFloat16), 2, allowed));
  at::autocast::set_autocast_enabled(at::kCPU, false);
  const auto bias = torch::zeros({2, 2, 1, 6});
  EXPECT_TRUE(qkv_attention_fuses(qkv, 2, allowed, {QkvPacking::by_head, bias}));
  // The fused node passes no gradient to the bias: a bias that wants one takes libtorch's path.
  EXPECT_FALSE(qkv_attention_fuses(qkv, 2, allowed, {QkvPacking::by_head, bias.clone().requires_grad_()}));
  EXPECT_FALSE(
      qkv_attention_fuses(qkv, 2, allowed, {QkvPacking::by_head, torch::zeros({2, 2, 1, 12}).slice(3, 0, 12, 2)}));
}

// Under bf16 autocast the bfloat16 qkv is computed on in float32 and the result rounded:
// exactly the float32 path on the bfloat16 values, gradients included, and within bfloat16
// rounding of libtorch's autocast expression (bfloat16 matmuls).
TEST(QkvAttention, Bf16AutocastComputesInFloat32OnTheBf16Values) {
  const auto allowed = masks(3, 40)[1];
  torch::manual_seed(8);
  const auto qkv = torch::randn({3, 40, 72}).to(torch::kBFloat16);
  auto autocast_run = [&](auto attention) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    auto result = run(attention, qkv, allowed, 3, {});
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    return result;
  };
  const auto fused = autocast_run(qkv_attention);
  const auto float32 = run(
      [](const torch::Tensor& x, int64_t heads, const torch::Tensor& mask, const QkvAttentionOptions& options) {
        return qkv_attention(x.to(torch::kFloat), heads, mask, options).to(torch::kBFloat16);
      },
      qkv, allowed, 3);
  EXPECT_EQ(fused.value.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(fused.grad.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(fused.value, float32.value));
  EXPECT_TRUE(torch::equal(fused.grad, float32.grad));
  const auto reference = autocast_run(qkv_attention_reference);
  EXPECT_LT(max_relative_difference(fused.value.to(torch::kFloat), reference.value.to(torch::kFloat)), 2e-2);
  EXPECT_LT(max_relative_difference(fused.grad.to(torch::kFloat), reference.grad.to(torch::kFloat)), 3e-2);
}

TEST(QkvAttention, RefusesBadShapesAndSecondOrderGradients) {
  const auto allowed = masks(2, 6)[0];
  EXPECT_THAT(error_of([&] {
                qkv_attention(torch::randn({2, 6, 13}), 2, allowed);
              }),
              HasSubstr("qkv_attention: qkv must be [B, T, 3C], got 3 dimension(s) with last size 13"));
  EXPECT_THAT(error_of([&] {
                qkv_attention(torch::randn({2, 6, 12}), 3, allowed);
              }),
              HasSubstr("qkv_attention: 4 channels are not divisible into 3 heads"));
  EXPECT_THAT(error_of([&] {
                qkv_attention(torch::randn({2, 5, 12}), 2, allowed);
              }),
              HasSubstr("allowed must be a bool [B or 1, 1, T, T] mask for B = 2, T = 5"));
  EXPECT_THAT(error_of([&] {
                qkv_attention(torch::randn({2, 6, 12}), 2, allowed, {QkvPacking::by_head, torch::zeros({2, 2, 6, 6})});
              }),
              HasSubstr("qkv_attention: key_bias must be a floating-point [B or 1, H, 1, T] tensor for B = 2, H = 2, "
                        "T = 6"));
  auto qkv = torch::randn({2, 6, 12}, torch::requires_grad());
  auto y = qkv_attention(qkv, 2, allowed);
  EXPECT_THAT(error_of([&] {
                torch::autograd::grad({y.sum()}, {qkv}, {}, /*retain_graph=*/true,
                                      /*create_graph=*/true);
              }),
              HasSubstr("not twice differentiable"));
}

}  // namespace qkv_attention_test
