// kernels/float32_cpu_matmuls.h: under bf16 (fp16) CPU autocast, once routed, the matmuls
// and convolutions equal float32 ops on bfloat16- (float16-) rounded operands, rounded to
// 16 bits, in value and in gradient. Its own executable (not gradaccum_tests): the routing changes
// libtorch's dispatcher for the rest of the process, and the other tests compare with
// libtorch's own autocast kernels.
#include <gtest/gtest.h>
#include <torch/torch.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "gradaccum/core/mixed_precision.h"
#include "gradaccum/kernels/float32_cpu_matmuls.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/chunked_cross_entropy.h"
#include "gradaccum/run/process_setup.h"

namespace {

using gradaccum::core::AutocastScope;
using gradaccum::core::MixedPrecision;

const torch::Device kCpu(torch::kCPU);

torch::Tensor rounded(const torch::Tensor& t) { return t.to(torch::kBFloat16).to(torch::kFloat); }

double relative_error(const torch::Tensor& x, const torch::Tensor& reference) {
  return ((x.to(torch::kDouble) - reference.to(torch::kDouble)).norm() / reference.to(torch::kDouble).norm())
      .item<double>();
}

// The operands of every op the routing replaces, drawn from `seed`.
struct ReplacedOpOperands {
  explicit ReplacedOpOperands(uint64_t seed) {
    torch::manual_seed(seed);
    x = torch::randn({2, 5, 16});
    m = torch::randn({5, 12});
    w = torch::randn({12, 16});
    bias = torch::randn({12});
    batch1 = torch::randn({2, 5, 16});
    batch2 = torch::randn({2, 16, 7});
    add = torch::randn({2, 5, 7});
    image = torch::randn({2, 3, 9, 9});
    kernel = torch::randn({4, 3, 3, 3});
    cbias = torch::randn({4});
    signal = torch::randn({2, 3, 11});
    kernel1d = torch::randn({4, 3, 3});
    q = torch::randn({2, 3, 6, 8});
    k = torch::randn({2, 3, 6, 8});
    v = torch::randn({2, 3, 6, 8});
    mask = torch::randn({2, 1, 6, 6});  // an additive float mask, as BLOOM's ALiBi bias
  }

  // Every replaced op, each operand passed through `operand` first (e.g. rounded to bfloat16).
  std::vector<torch::Tensor> run(const std::function<torch::Tensor(const torch::Tensor&)>& operand) const {
    const std::vector<int64_t> stride2{2}, pad0{0};
    return {torch::linear(operand(x), operand(w), operand(bias)),
            torch::matmul(operand(x), operand(w).t()),
            torch::addmm(operand(m), operand(x)[0], operand(w).t(), 0.5, 2.0),
            torch::bmm(operand(batch1), operand(batch2)),
            torch::baddbmm(operand(add), operand(batch1), operand(batch2), 0.5, 2.0),
            torch::conv2d(operand(image), operand(kernel), operand(cbias), 1, 1),
            torch::conv1d(operand(signal), operand(kernel1d), operand(cbias), at::IntArrayRef(stride2),
                          at::IntArrayRef(pad0)),
            at::scaled_dot_product_attention(operand(q), operand(k), operand(v), operand(mask), 0.0, false, 0.3)};
  }

  torch::Tensor x, m, w, bias, batch1, batch2, add, image, kernel, cbias, signal, kernel1d, q, k, v, mask;
};

torch::Tensor as_is(const torch::Tensor& t) { return t; }

// Every op the routing replaces, run under bf16 CPU autocast on operands drawn from seed 6; with a
// linear's weight and bias gradients last.
std::vector<torch::Tensor> every_replaced_op_under_autocast() {
  ReplacedOpOperands operands(6);
  operands.w.requires_grad_(true);
  operands.bias.requires_grad_(true);
  AutocastScope autocast(MixedPrecision::bf16, kCpu);
  auto out = operands.run(as_is);
  (out[0].to(torch::kFloat) * torch::arange(120).view({2, 5, 12})).sum().backward();
  for (auto& t : out) t = t.detach();
  out.push_back(operands.w.grad());
  out.push_back(operands.bias.grad());
  return out;
}

class Float32Bf16Matmuls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    torch::manual_seed(3);
    a_ = torch::randn({64, 8192});
    b_ = torch::randn({8192, 48});
    exact_ = torch::mm(rounded(a_), rounded(b_));  // float32 sums of the bfloat16 products
    {
      AutocastScope autocast(MixedPrecision::bf16, kCpu);
      unrouted_error_ = relative_error(torch::mm(a_, b_), exact_);
    }
    libtorch_own_ = every_replaced_op_under_autocast();
    ASSERT_FALSE(gradaccum::kernels::cpu_autocast_matmuls_route_through_float32());
    gradaccum::kernels::route_cpu_autocast_matmuls_through_float32();
    gradaccum::kernels::route_cpu_autocast_matmuls_through_float32();  // idempotent
  }
  static torch::Tensor a_, b_, exact_;
  static double unrouted_error_;
  static std::vector<torch::Tensor> libtorch_own_;  // before the routing was installed
};
torch::Tensor Float32Bf16Matmuls::a_, Float32Bf16Matmuls::b_, Float32Bf16Matmuls::exact_;
double Float32Bf16Matmuls::unrouted_error_ = 0.0;
std::vector<torch::Tensor> Float32Bf16Matmuls::libtorch_own_;

// A run's set-up turns the route on or off for its lifetime and puts it back after.
TEST_F(Float32Bf16Matmuls, AProcessSetupScopesTheRoute) {
  namespace kernels = gradaccum::kernels;
  ASSERT_TRUE(kernels::cpu_autocast_matmuls_route_through_float32());
  {
    const gradaccum::run::ProcessSetup off({.threads = 1, .cpu_matmuls_through_float32 = false});
    EXPECT_FALSE(kernels::cpu_autocast_matmuls_route_through_float32());
    {
      const gradaccum::run::ProcessSetup on({.threads = 1, .cpu_matmuls_through_float32 = true});
      EXPECT_TRUE(kernels::cpu_autocast_matmuls_route_through_float32());
    }
    EXPECT_FALSE(kernels::cpu_autocast_matmuls_route_through_float32());
  }
  EXPECT_TRUE(kernels::cpu_autocast_matmuls_route_through_float32());
}

// Switched off, the installed entries give what libtorch's own gave before they were installed,
// bit for bit, values and gradients; switched on again, they route.
TEST_F(Float32Bf16Matmuls, SwitchedOffTheEntriesDoWhatLibtorchsOwnDo) {
  gradaccum::kernels::route_cpu_autocast_matmuls_through_float32(false);
  EXPECT_FALSE(gradaccum::kernels::cpu_autocast_matmuls_route_through_float32());
  const auto off = every_replaced_op_under_autocast();
  gradaccum::kernels::route_cpu_autocast_matmuls_through_float32(true);
  EXPECT_TRUE(gradaccum::kernels::cpu_autocast_matmuls_route_through_float32());
  ASSERT_EQ(off.size(), libtorch_own_.size());
  for (size_t i = 0; i < off.size(); ++i) {
    EXPECT_EQ(off[i].scalar_type(), libtorch_own_[i].scalar_type()) << "output " << i;
    EXPECT_TRUE(torch::equal(off[i], libtorch_own_[i])) << "output " << i;
  }
}

TEST_F(Float32Bf16Matmuls, MmIsTheFloat32ProductOfRoundedOperandsRounded) {
  EXPECT_TRUE(gradaccum::kernels::cpu_autocast_matmuls_route_through_float32());
  AutocastScope autocast(MixedPrecision::bf16, kCpu);
  const auto y = torch::mm(a_, b_);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(y, exact_.to(torch::kBFloat16)));
  // Only the result's rounding is left: ~2^-9 relative. libtorch's fallback GEMM (CPUs
  // without AVX-512) sums over k = 8192 in bfloat16 and is off by ~10%.
  EXPECT_LT(relative_error(y, exact_), 0.003);
  std::cout << "relative error over k = 8192: " << relative_error(y, exact_) << " routed, " << unrouted_error_
            << " with libtorch's bf16 kernel on this CPU\n";
}

TEST_F(Float32Bf16Matmuls, EveryRoutedOpMatchesItsFloat32Expression) {
  const ReplacedOpOperands operands(4);
  std::vector<torch::Tensor> routed;
  {
    AutocastScope autocast(MixedPrecision::bf16, kCpu);
    routed = operands.run(as_is);
  }
  // Without autocast: float32 on the rounded operands, the result rounded.
  const auto expected = operands.run(rounded);
  for (size_t i = 0; i < routed.size(); ++i) {
    EXPECT_EQ(routed[i].scalar_type(), torch::kBFloat16) << "op " << i;
    EXPECT_TRUE(torch::equal(routed[i], expected[i].to(torch::kBFloat16))) << "op " << i;
  }
}

TEST_F(Float32Bf16Matmuls, GradientsAreThoseOfTheExplicitCasts) {
  torch::manual_seed(5);
  const auto x = torch::randn({6, 32});
  auto w = torch::randn({10, 32}, torch::requires_grad());
  auto b = torch::randn({10}, torch::requires_grad());
  {
    AutocastScope autocast(MixedPrecision::bf16, kCpu);
    (torch::linear(x, w, b).to(torch::kFloat) * torch::arange(60).view({6, 10})).sum().backward();
  }
  auto w2 = w.detach().clone().requires_grad_(true);
  auto b2 = b.detach().clone().requires_grad_(true);
  (torch::linear(rounded(x), rounded(w2), rounded(b2)).to(torch::kBFloat16).to(torch::kFloat) *
   torch::arange(60).view({6, 10}))
      .sum()
      .backward();
  EXPECT_TRUE(torch::equal(w.grad(), w2.grad()));
  EXPECT_TRUE(torch::equal(b.grad(), b2.grad()));
  EXPECT_GT(w.grad().abs().max().item<double>(), 1.0);
}

// The routed linear keeps 16-bit copies for its backward (and rounds the weight again there);
// its outputs and gradients are still those of the explicit casts, bit for bit, for 2-D and
// contiguous 3-D inputs with and without a bias, a bfloat16 input, a float16 region, and a
// transposed input (which takes the generic route).
TEST_F(Float32Bf16Matmuls, LinearGradientsInEveryInputShapeAreThoseOfTheExplicitCasts) {
  torch::manual_seed(8);
  struct Case {
    std::string name;
    torch::Tensor x;
    bool bias;
    MixedPrecision precision;
  };
  const std::vector<Case> cases = {
      {"2-D", torch::randn({12, 32}), true, MixedPrecision::bf16},
      {"3-D", torch::randn({3, 5, 32}), true, MixedPrecision::bf16},
      {"3-D, no bias", torch::randn({3, 5, 32}), false, MixedPrecision::bf16},
      {"bfloat16 input", torch::randn({3, 5, 32}).to(torch::kBFloat16), true, MixedPrecision::bf16},
      {"transposed", torch::randn({5, 3, 32}).transpose(0, 1), true, MixedPrecision::bf16},
      {"float16", torch::randn({3, 5, 32}), true, MixedPrecision::fp16},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto lower = c.precision == MixedPrecision::bf16 ? torch::kBFloat16 : torch::kHalf;
    auto cast = [lower](const torch::Tensor& t) { return t.to(lower).to(torch::kFloat); };
    const auto w0 = torch::randn({10, 32}), b0 = torch::randn({10});
    const auto weights = torch::randn({10}).to(lower).to(torch::kFloat);  // a gradient per output
    auto run = [&](bool routed) {
      auto x = c.x.detach().clone(torch::MemoryFormat::Preserve).requires_grad_(true);
      auto w = w0.clone().requires_grad_(true);
      auto b = b0.clone().requires_grad_(true);
      torch::Tensor y;
      if (routed) {
        AutocastScope autocast(c.precision, kCpu);
        y = c.bias ? torch::linear(x, w, b) : torch::linear(x, w);
      } else {
        y = (c.bias ? torch::linear(cast(x), cast(w), cast(b)) : torch::linear(cast(x), cast(w))).to(lower);
      }
      (y.to(torch::kFloat) * weights).sum().backward();
      return std::vector<torch::Tensor>{y, x.grad(), w.grad(), c.bias ? b.grad() : torch::zeros({1})};
    };
    const auto routed = run(true), expected = run(false);
    EXPECT_EQ(routed[0].scalar_type(), lower);
    EXPECT_EQ(routed[1].scalar_type(), c.x.scalar_type());
    for (size_t i = 0; i < routed.size(); ++i) EXPECT_TRUE(torch::equal(routed[i], expected[i])) << "output " << i;
    EXPECT_GT(routed[2].abs().max().item<double>(), 0.1);
  }
}

#if defined(__GLIBC__)
// What the routed linear holds from its forward to its backward: the bfloat16 input, not a
// float32 copy of the rounded weight (16 MB here), which the explicit casts' graph holds.
TEST_F(Float32Bf16Matmuls, LinearHoldsNoFloat32CopyOfItsWeightForTheBackward) {
  const auto in_use = [] {
    const auto m = mallinfo2();
    return static_cast<int64_t>(m.uordblks + m.hblkhd);
  };
  const auto x = torch::randn({2, 8, 2048}).requires_grad_(true);
  const auto w = torch::randn({2048, 2048}).requires_grad_(true);  // 16 MB in float32
  const int64_t weight_bytes = w.numel() * 4;
  int64_t routed_held = 0, explicit_held = 0;
  // Twice: the first round's numbers include what BLAS allocates and keeps on its first GEMMs.
  for (int round = 0; round < 2; ++round) {
    const auto before = in_use();
    torch::Tensor y;
    {
      AutocastScope autocast(MixedPrecision::bf16, kCpu);
      y = torch::linear(x, w);
    }
    routed_held = in_use() - before;
    y.to(torch::kFloat).sum().backward();
    const auto before_explicit = in_use();
    const auto y2 = torch::linear(rounded(x), rounded(w)).to(torch::kBFloat16);
    explicit_held = in_use() - before_explicit;
    y2.to(torch::kFloat).sum().backward();
  }
  std::cout << "held from forward to backward: routed " << routed_held << " B, explicit casts " << explicit_held
            << " B\n";
  EXPECT_LT(routed_held, weight_bytes / 4);
  EXPECT_GE(explicit_held, weight_bytes);
  EXPECT_TRUE(w.grad().defined());
}
#endif

// The fused LM-head loss runs its own projections with autocast excluded; routed, they
// must compute what the routed linear + causal_lm_loss compute.
TEST_F(Float32Bf16Matmuls, TheFusedLmLossFollowsTheRouting) {
  torch::manual_seed(6);
  const int64_t vocab = 300, hidden_size = 48;
  auto labels = torch::randint(vocab, {3, 20}, torch::kLong);
  labels.index_put_({0, torch::indexing::Slice(15, 20)}, gradaccum::core::kIgnoreIndex);
  const auto hidden0 = torch::randn({3, 20, hidden_size});
  const auto weight0 = torch::randn({vocab, hidden_size}) * 0.2;
  auto run = [&](bool fused) {
    auto hidden = hidden0.clone().requires_grad_(true);
    auto weight = weight0.clone().requires_grad_(true);
    gradaccum::core::LossSum loss;
    {
      AutocastScope autocast(MixedPrecision::bf16, kCpu);
      loss = fused ? gradaccum::models::chunked_causal_lm_loss(hidden, weight, labels, 64)
                   : gradaccum::models::causal_lm_loss(torch::linear(hidden, weight), labels);
    }
    loss.sum.backward();
    return std::vector<torch::Tensor>{loss.sum.detach(), hidden.grad(), weight.grad()};
  };
  const auto fused = run(true), plain = run(false);
  for (size_t i = 0; i < fused.size(); ++i) {
    // One chunk of 64 ≥ 60 tokens: both round the logits and the gradient GEMMs' results to
    // bfloat16 at the same points; only the float32 summation orders differ. (With several
    // chunks the fused loss rounds d weight per chunk: 0.0024 apart at 16 tokens a chunk.)
    EXPECT_LT(relative_error(fused[i], plain[i]), 1e-3) << "output " << i;
  }
  EXPECT_GT(fused[2].abs().max().item<double>(), 0.01);
}

TEST_F(Float32Bf16Matmuls, Float64AndUnautocastedCallsAreUntouched) {
  const auto a = torch::randn({4, 8}, torch::kDouble), b = torch::randn({8, 3}, torch::kDouble);
  {
    AutocastScope autocast(MixedPrecision::bf16, kCpu);
    const auto y = torch::mm(a, b);
    EXPECT_EQ(y.scalar_type(), torch::kDouble);
    EXPECT_TRUE(torch::equal(y, torch::mm(a, b)));
  }
  const auto f = torch::mm(a_.slice(0, 0, 4), b_);  // no autocast: plain float32
  EXPECT_EQ(f.scalar_type(), torch::kFloat);
  EXPECT_FALSE(torch::equal(f, exact_.slice(0, 0, 4)));  // unrounded operands differ
}

// fp16: the same routing rounds to float16, the dtype of the autocast region it runs in,
// and the weight gradient is rounded to float16 where autocast's cast would round it:
// an overflow becomes inf there, which is what fp16's loss scaler detects.
TEST_F(Float32Bf16Matmuls, Fp16RoundsToFloat16AndItsWeightGradientOverflowsToInf) {
  torch::manual_seed(7);
  auto half = [](const torch::Tensor& t) { return t.to(torch::kHalf).to(torch::kFloat); };
  const auto x = torch::randn({6, 32});
  auto w = torch::randn({10, 32}, torch::requires_grad());
  auto b = torch::randn({10}, torch::requires_grad());
  torch::Tensor y;
  {
    AutocastScope autocast(MixedPrecision::fp16, kCpu);
    y = torch::linear(x, w, b);
  }
  EXPECT_EQ(y.scalar_type(), torch::kHalf);
  EXPECT_TRUE(torch::equal(y, torch::linear(half(x), half(w), half(b)).to(torch::kHalf)));
  // bfloat16 rounding would differ: float16 keeps 11 significant bits, bfloat16 8.
  EXPECT_FALSE(torch::equal(y.to(torch::kFloat), torch::linear(rounded(x), rounded(w), rounded(b))));
  // A gradient of 1e5 per output is beyond float16's 65504: it becomes inf at the cast, and
  // w's gradient is not finite (inf, or nan where infinities of both signs meet).
  (y.to(torch::kFloat) * 1e5).sum().backward();
  EXPECT_FALSE(torch::isfinite(w.grad()).any().item<bool>());
  EXPECT_TRUE(torch::isinf(b.grad()).all().item<bool>());
  // At 1e-2 every gradient element is finite and equals the float16-rounded float32 one.
  w.mutable_grad() = torch::Tensor();
  {
    AutocastScope autocast(MixedPrecision::fp16, kCpu);
    (torch::linear(x, w, b).to(torch::kFloat) * 1e-2).sum().backward();
  }
  auto w2 = w.detach().clone().requires_grad_(true);
  (torch::linear(half(x), half(w2), half(b)).to(torch::kHalf).to(torch::kFloat) * 1e-2).sum().backward();
  EXPECT_TRUE(torch::isfinite(w.grad()).all().item<bool>());
  EXPECT_TRUE(torch::equal(w.grad(), w2.grad()));
}

}  // namespace
