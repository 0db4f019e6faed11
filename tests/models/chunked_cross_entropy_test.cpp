// chunked_causal_lm_loss against the plain causal_lm_loss(linear(hidden,
// weight), labels): loss, count and both gradients for several chunk sizes and
// dtypes, whole GPT-2 and BLOOM models with and without chunking, the
// all-ignored batch, bf16 autocast, and the errors.
#include "gradaccum/models/chunked_cross_entropy.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "dtype_cases.h"
#include "gradaccum/models/bloom.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/gpt2.h"
#include "padded_batches.h"
#include "test_support.h"
#include "tiny_decoders.h"

namespace chunked_cross_entropy_test {

using gradaccum::testing::tiny_bloom_config;
using gradaccum::testing::tiny_gpt2_config;

using gradaccum::core::kIgnoreIndex;
using gradaccum::models::BloomConfig;
using gradaccum::models::BloomForCausalLm;
using gradaccum::models::causal_lm_loss;
using gradaccum::models::CausalLm;
using gradaccum::models::chunked_causal_lm_loss;
using gradaccum::models::Gpt2Config;
using gradaccum::models::Gpt2LmHeadModel;
using gradaccum::models::TargetSelection;
using gradaccum::testing::flat_grads;
using gradaccum::testing::max_relative_difference;
using gradaccum::testing::pad;
using gradaccum::testing::zero_grads;

constexpr int64_t kVocab = 37;
constexpr int64_t kHidden = 8;
// The incoming gradient of the loss sum: not 1, so the backward's scaling by it is checked.
constexpr double kGradScale = 0.37;

struct Inputs {
  torch::Tensor hidden;  // [B, T, H]
  torch::Tensor weight;  // [V, H]
  torch::Tensor labels;  // [B, T] int64
};

// Rows of different real lengths, right- and left-padded, with an ignored label
// in the middle of one row: 3 rows × 9 positions, 17 targets after the shift
// (a left-padded row's first real token is a target, as in causal_lm.h).
Inputs make_inputs(torch::ScalarType dtype) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(2024);
  Inputs in;
  in.hidden = torch::randn({3, 9, kHidden}, generator, torch::kDouble).to(dtype);
  in.weight = torch::randn({kVocab, kHidden}, generator, torch::kDouble).to(dtype);
  in.labels = torch::randint(0, kVocab, {3, 9}, generator, torch::kLong);
  in.labels[0].slice(0, 6, 9).fill_(kIgnoreIndex);  // right padding: 6 real tokens, 5 targets
  in.labels[1].slice(0, 0, 4).fill_(kIgnoreIndex);  // left padding: 5 real tokens, 5 targets
  in.labels[2][4] = kIgnoreIndex;                   // one ignored label: 7 targets
  return in;
}

struct Result {
  torch::Tensor sum, count, grad_hidden, grad_weight;
};

// Both ways of choosing the projected positions (compact is automatic's choice on the CPU,
// masked on accelerators).
const TargetSelection kSelections[] = {TargetSelection::compact, TargetSelection::masked};

const char* name_of(TargetSelection selection) { return selection == TargetSelection::masked ? "masked" : "compact"; }

// chunk_tokens 0 = the plain path.
Result run(const Inputs& in, int64_t chunk_tokens, TargetSelection selection = TargetSelection::automatic) {
  auto hidden = in.hidden.clone().requires_grad_(true);
  auto weight = in.weight.clone().requires_grad_(true);
  auto loss = chunk_tokens == 0 ? causal_lm_loss(torch::nn::functional::linear(hidden, weight), in.labels)
                                : chunked_causal_lm_loss(hidden, weight, in.labels, chunk_tokens, selection);
  (loss.sum * kGradScale).backward();
  return {loss.sum.detach(), loss.count, hidden.grad(), weight.grad()};
}

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return max_relative_difference(a.to(torch::kDouble), b.to(torch::kDouble));
}

void expect_matches_plain(torch::ScalarType dtype, double tolerance) {
  const auto in = make_inputs(dtype);
  const auto plain = run(in, 0);
  ASSERT_EQ(plain.count.item<int64_t>(), 17);
  // 1 splits the 17 targets (27 positions when masked) evenly, 3 and 7 leave a short
  // last chunk, 1000 is one chunk.
  for (const auto selection : kSelections) {
    for (int64_t chunk : {1, 3, 7, 1000}) {
      SCOPED_TRACE(std::string(name_of(selection)) + ", chunk_tokens " + std::to_string(chunk));
      const auto chunked = run(in, chunk, selection);
      EXPECT_EQ(chunked.sum.scalar_type(), dtype);
      EXPECT_EQ(chunked.count.scalar_type(), torch::kLong);
      EXPECT_EQ(chunked.count.item<int64_t>(), 17);
      const double loss_diff = relative(chunked.sum, plain.sum);
      const double hidden_diff = relative(chunked.grad_hidden, plain.grad_hidden);
      const double weight_diff = relative(chunked.grad_weight, plain.grad_weight);
      std::printf("[ measured ] %s %s chunk %lld: loss %.3e, grad hidden %.3e, grad weight %.3e\n",
                  c10::toString(dtype), name_of(selection), static_cast<long long>(chunk), loss_diff, hidden_diff,
                  weight_diff);
      EXPECT_LE(loss_diff, tolerance);
      EXPECT_EQ(chunked.grad_hidden.scalar_type(), dtype);
      EXPECT_EQ(chunked.grad_weight.scalar_type(), dtype);
      EXPECT_LE(hidden_diff, tolerance);
      EXPECT_LE(weight_diff, tolerance);
      // Positions whose shifted label is ignored (and every row's last) get no gradient.
      EXPECT_EQ(chunked.grad_hidden[0].slice(0, 5, 9).abs().max().item<double>(), 0.0);
      EXPECT_EQ(chunked.grad_hidden[1].slice(0, 0, 3).abs().max().item<double>(), 0.0);
      EXPECT_EQ(chunked.grad_hidden[2][3].abs().max().item<double>(), 0.0);
      EXPECT_GT(chunked.grad_hidden[2][4].abs().max().item<double>(), 0.0);
    }
  }
}

class ChunkedCrossEntropyDtypes : public ::testing::TestWithParam<gradaccum::testing::DtypeCase> {};

TEST_P(ChunkedCrossEntropyDtypes, MatchesPlainLoss) { expect_matches_plain(GetParam().dtype, GetParam().tolerance); }

INSTANTIATE_TEST_SUITE_P(, ChunkedCrossEntropyDtypes, gradaccum::testing::dtype_cases(1e-10, 1e-5),
                         gradaccum::testing::dtype_case_name);

// The custom backward against central finite differences of the forward
// alone (float64, chunk 3), at every element of hidden and weight.
TEST(ChunkedCrossEntropy, GradientsMatchFiniteDifferences) {
  for (const auto selection : kSelections) {
    SCOPED_TRACE(name_of(selection));
    const auto in = make_inputs(torch::kDouble);
    const auto analytic = run(in, 3, selection);
    const double eps = 1e-6;
    auto loss_at = [&](const torch::Tensor& hidden, const torch::Tensor& weight) {
      torch::NoGradGuard no_grad;
      return chunked_causal_lm_loss(hidden, weight, in.labels, 3, selection).sum.item<double>() * kGradScale;
    };
    auto numeric = [&](bool of_hidden) {
      const auto& base = of_hidden ? in.hidden : in.weight;
      auto grad = torch::zeros_like(base);
      auto flat = grad.view({-1});
      for (int64_t i = 0; i < base.numel(); ++i) {
        auto plus = base.clone(), minus = base.clone();
        plus.view({-1})[i] += eps;
        minus.view({-1})[i] -= eps;
        const double up = of_hidden ? loss_at(plus, in.weight) : loss_at(in.hidden, plus);
        const double down = of_hidden ? loss_at(minus, in.weight) : loss_at(in.hidden, minus);
        flat[i] = (up - down) / (2 * eps);
      }
      return grad;
    };
    EXPECT_LE(relative(analytic.grad_hidden, numeric(true)), 1e-7);
    EXPECT_LE(relative(analytic.grad_weight, numeric(false)), 1e-7);
  }
}

// A target ~200 nats below the row's best logit: its probability underflows float32
// (e^-200), yet its log-probability, the loss and the gradients stay those of the plain
// log_softmax loss, in both target layouts.
TEST(ChunkedCrossEntropy, TargetFarBelowTheBestKeepsItsLossInFloat32) {
  // vocab 4, width 2: logits of any position with hidden (1, 0) are (100, -100, 0, 0).
  const auto weight = torch::tensor({{100.0F, 0.0F}, {-100.0F, 0.0F}, {0.0F, 1.0F}, {0.0F, -1.0F}});
  const auto hidden = torch::tensor({{{1.0F, 0.0F}, {1.0F, 0.0F}, {1.0F, 0.0F}}});
  // Shifted targets: id 1 (logit -100), id 0 (logit 100).
  const auto labels = torch::tensor({{3, 1, 0}}, torch::kLong);
  const auto plain_weight = weight.clone().requires_grad_();
  const auto plain_hidden = hidden.clone().requires_grad_();
  auto plain = causal_lm_loss(torch::nn::functional::linear(plain_hidden, plain_weight), labels);
  plain.sum.backward();
  const double expected =
      200.0 + std::log1p(std::exp(-200.0) + 2 * std::exp(-100.0)) + std::log1p(std::exp(-200.0) + 2 * std::exp(-100.0));
  EXPECT_NEAR(plain.sum.item<double>(), expected, 1e-4);
  for (auto selection : {TargetSelection::compact, TargetSelection::masked}) {
    const auto w = weight.clone().requires_grad_();
    const auto h = hidden.clone().requires_grad_();
    auto fused = chunked_causal_lm_loss(h, w, labels, 1, selection);
    fused.sum.backward();
    EXPECT_TRUE(std::isfinite(fused.sum.item<double>()));
    EXPECT_NEAR(fused.sum.item<double>(), expected, 1e-4);
    EXPECT_EQ(fused.count.item<int64_t>(), 2);
    EXPECT_LE(max_relative_difference(w.grad(), plain_weight.grad()), 1e-6);
    EXPECT_LE(max_relative_difference(h.grad(), plain_hidden.grad()), 1e-6);
  }
}

TEST(ChunkedCrossEntropy, AllLabelsIgnoredGivesZeroLossCountAndGradients) {
  for (const auto selection : kSelections) {
    SCOPED_TRACE(name_of(selection));
    auto in = make_inputs(torch::kFloat);
    in.labels.fill_(kIgnoreIndex);
    const auto chunked = run(in, 4, selection);
    EXPECT_EQ(chunked.sum.item<double>(), 0.0);
    EXPECT_EQ(chunked.count.item<int64_t>(), 0);
    ASSERT_TRUE(chunked.grad_hidden.defined());
    ASSERT_TRUE(chunked.grad_weight.defined());
    EXPECT_EQ(chunked.grad_hidden.abs().max().item<double>(), 0.0);
    EXPECT_EQ(chunked.grad_weight.abs().max().item<double>(), 0.0);
    EXPECT_FALSE(chunked.grad_hidden.isnan().any().item<bool>());
    EXPECT_FALSE(chunked.grad_weight.isnan().any().item<bool>());
    // One position per row: the shift leaves no target at all.
    Inputs single{in.hidden.slice(1, 0, 1), in.weight, in.labels.slice(1, 0, 1).fill_(3)};
    const auto one = run(single, 4, selection);
    EXPECT_EQ(one.sum.item<double>(), 0.0);
    EXPECT_EQ(one.count.item<int64_t>(), 0);
  }
}

TEST(ChunkedCrossEntropy, OnlyTheRequestedGradientIsComputed) {
  const auto in = make_inputs(torch::kDouble);
  const auto plain = run(in, 0);
  auto hidden = in.hidden.clone().requires_grad_(true);  // weight frozen
  (chunked_causal_lm_loss(hidden, in.weight, in.labels, 4).sum * kGradScale).backward();
  EXPECT_LE(relative(hidden.grad(), plain.grad_hidden), 1e-10);
}

// The gradients are computed in the forward and scaled in place by the
// backward: a second backward through a retained graph is a clear error, not a
// wrong gradient, and under no_grad the result has no graph at all.
TEST(ChunkedCrossEntropy, SecondBackwardThroughARetainedGraphIsAnError) {
  const auto in = make_inputs(torch::kDouble);
  const auto plain = run(in, 0);
  auto hidden = in.hidden.clone().requires_grad_(true);
  auto weight = in.weight.clone().requires_grad_(true);
  auto loss = chunked_causal_lm_loss(hidden, weight, in.labels, 5);
  (loss.sum * kGradScale).backward({}, /*retain_graph=*/true);
  EXPECT_LE(relative(hidden.grad(), plain.grad_hidden), 1e-10);
  EXPECT_LE(relative(weight.grad(), plain.grad_weight), 1e-10);
  EXPECT_ONE_LINE_ERROR((loss.sum * kGradScale).backward(),
                        "a second backward through the same graph (retain_graph) is not supported");
  // The first backward's gradients are untouched by the refused second one.
  EXPECT_LE(relative(hidden.grad(), plain.grad_hidden), 1e-10);

  torch::NoGradGuard no_grad;
  auto evaluated = chunked_causal_lm_loss(hidden, weight, in.labels, 5);
  EXPECT_FALSE(evaluated.sum.requires_grad());
  EXPECT_LE(relative(evaluated.sum, plain.sum), 1e-12);
}

// Sets bf16 CPU autocast for its lifetime and restores the previous state.
class CpuAutocastBf16 {
 public:
  CpuAutocastBf16()
      : enabled_(at::autocast::is_autocast_enabled(at::kCPU)), dtype_(at::autocast::get_autocast_dtype(at::kCPU)) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  }
  ~CpuAutocastBf16() {
    at::autocast::set_autocast_enabled(at::kCPU, enabled_);
    at::autocast::set_autocast_dtype(at::kCPU, dtype_);
    at::autocast::clear_cache();
  }

 private:
  bool enabled_;
  at::ScalarType dtype_;
};

// bf16 has an 8-bit mantissa (relative rounding 2^-9 ≈ 2e-3): the loss is a
// sum of many such terms, and the gradients go through two bf16 matmuls.
constexpr double kBf16LossTolerance = 1e-2;
constexpr double kBf16GradTolerance = 3e-2;

TEST(ChunkedCrossEntropy, Bf16AutocastRunsMatmulsInBf16AndSoftmaxInFloat32) {
  const auto in = make_inputs(torch::kFloat);
  const auto fp32 = run(in, 0);

  auto hidden = in.hidden.clone().requires_grad_(true);
  auto weight = in.weight.clone().requires_grad_(true);
  gradaccum::core::LossSum loss;
  {
    CpuAutocastBf16 autocast;
    loss = chunked_causal_lm_loss(hidden, weight, in.labels, 4);
  }
  // backward() outside the autocast region: the precision was fixed at forward time.
  (loss.sum * kGradScale).backward();
  EXPECT_EQ(loss.sum.scalar_type(), torch::kFloat);
  EXPECT_EQ(hidden.grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(weight.grad().scalar_type(), torch::kFloat);

  const double loss_diff = relative(loss.sum.detach(), fp32.sum);
  const double hidden_diff = relative(hidden.grad(), fp32.grad_hidden);
  const double weight_diff = relative(weight.grad(), fp32.grad_weight);
  std::printf("[ measured ] bf16 autocast vs float32: loss %.3e, grad hidden %.3e, grad weight %.3e\n", loss_diff,
              hidden_diff, weight_diff);
  EXPECT_LE(loss_diff, kBf16LossTolerance);
  EXPECT_LE(hidden_diff, kBf16GradTolerance);
  EXPECT_LE(weight_diff, kBf16GradTolerance);
  // The matmuls did run in bf16: the result is not float32's.
  EXPECT_GT(loss_diff, 1e-6);
  EXPECT_GT(hidden_diff, 1e-6);

  // The plain path under the same autocast (bf16 linear, then cross_entropy)
  // rounds differently (one bf16 matmul over all tokens): within bf16 tolerance.
  auto hidden_plain = in.hidden.clone().requires_grad_(true);
  auto weight_plain = in.weight.clone().requires_grad_(true);
  {
    CpuAutocastBf16 autocast;
    auto plain = causal_lm_loss(torch::nn::functional::linear(hidden_plain, weight_plain), in.labels);
    (plain.sum * kGradScale).backward();
    EXPECT_LE(relative(loss.sum.detach(), plain.sum.detach()), kBf16LossTolerance);
  }
  EXPECT_LE(relative(hidden.grad(), hidden_plain.grad()), kBf16GradTolerance);
  EXPECT_LE(relative(weight.grad(), weight_plain.grad()), kBf16GradTolerance);

  // The same backward inside the autocast region gives the same gradients.
  auto hidden2 = in.hidden.clone().requires_grad_(true);
  auto weight2 = in.weight.clone().requires_grad_(true);
  {
    CpuAutocastBf16 autocast;
    (chunked_causal_lm_loss(hidden2, weight2, in.labels, 4).sum * kGradScale).backward();
  }
  EXPECT_TRUE(torch::equal(hidden2.grad(), hidden.grad()));
  EXPECT_TRUE(torch::equal(weight2.grad(), weight.grad()));
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));

  // The masked selection (what automatic picks on a GPU) under the same autocast:
  // its chunks hold other rows, so it rounds differently, within bf16 tolerance.
  auto hidden3 = in.hidden.clone().requires_grad_(true);
  auto weight3 = in.weight.clone().requires_grad_(true);
  gradaccum::core::LossSum masked;
  {
    CpuAutocastBf16 autocast;
    masked = chunked_causal_lm_loss(hidden3, weight3, in.labels, 4, TargetSelection::masked);
  }
  (masked.sum * kGradScale).backward();
  EXPECT_EQ(masked.count.item<int64_t>(), 17);
  EXPECT_LE(relative(masked.sum.detach(), fp32.sum), kBf16LossTolerance);
  EXPECT_LE(relative(hidden3.grad(), fp32.grad_hidden), kBf16GradTolerance);
  EXPECT_LE(relative(weight3.grad(), fp32.grad_weight), kBf16GradTolerance);
}

TEST(ChunkedCrossEntropy, BadInputIsAOneLineError) {
  const auto in = make_inputs(torch::kFloat);
  EXPECT_ONE_LINE_ERROR(chunked_causal_lm_loss(in.hidden, in.weight, in.labels, 0),
                        "chunk_tokens must be positive, got 0");
  EXPECT_ONE_LINE_ERROR(chunked_causal_lm_loss(in.hidden, in.weight.slice(1, 0, 4), in.labels, 2),
                        "weight [37, 4] does not match hidden states [3, 9, 8]");
  EXPECT_ONE_LINE_ERROR(chunked_causal_lm_loss(in.hidden, in.weight, in.labels.slice(1, 0, 5), 2),
                        "hidden states [3, 9, 8] do not match labels [3, 5]");
  auto labels = in.labels.clone();
  labels[2][5] = kVocab;
  EXPECT_ONE_LINE_ERROR(chunked_causal_lm_loss(in.hidden, in.weight, labels, 2),
                        "label 37 is outside the vocabulary [0, 37)");
  CausalLm model{Gpt2LmHeadModel(Gpt2Config{64, 32, 16, 1, 2})};
  EXPECT_ONE_LINE_ERROR(model.set_loss_chunk_tokens(-1),
                        "loss_chunk_tokens must be 0 (plain loss) or positive, got -1");
  EXPECT_ONE_LINE_ERROR(CausalLm(Gpt2LmHeadModel(Gpt2Config{64, 32, 16, 1, 2}), -5),
                        "loss_chunk_tokens must be 0 (plain loss) or positive, got -5");
}

// Whole models: every parameter's gradient (the tied embedding gets both the
// lookup's and the head's) with chunking equals the plain loss's.
struct ModelRun {
  double loss;
  int64_t count;
  torch::Tensor grads;
};

ModelRun model_run(CausalLm& model, const gradaccum::core::Batch& batch) {
  zero_grads(model.module());
  auto loss = model.loss(batch);
  (loss.sum * kGradScale).backward();
  return {loss.sum.item<double>(), loss.count.item<int64_t>(), flat_grads(model.module())};
}

void expect_model_chunking_exact(CausalLm model, torch::ScalarType dtype, bool left_padding, double tolerance) {
  model.module().to(dtype);
  const auto data = pad(gradaccum::testing::make_sequences({3, 11, 6, 9}, 17), left_padding);
  const auto labels = data.ids.masked_fill(data.mask.eq(0), kIgnoreIndex);
  const gradaccum::core::Batch batch{data.ids, labels, data.mask, 4};
  ASSERT_EQ(model.loss_chunk_tokens(), 0);
  const auto plain = model_run(model, batch);
  // Lengths 3, 11, 6, 9 in width 11: n - 1 targets a row under right padding,
  // n under left padding for the rows that have a pad before them.
  ASSERT_EQ(plain.count, left_padding ? 3 + 10 + 6 + 9 : 2 + 10 + 5 + 8);
  for (int64_t chunk : {1, 4, 7, 4096}) {
    SCOPED_TRACE("chunk_tokens " + std::to_string(chunk));
    model.set_loss_chunk_tokens(chunk);
    const auto chunked = model_run(model, batch);
    EXPECT_EQ(chunked.count, plain.count);
    const double loss_diff = std::abs(chunked.loss - plain.loss) / std::abs(plain.loss);
    const double grad_diff = max_relative_difference(chunked.grads, plain.grads);
    std::printf("[ measured ] chunk %lld: loss %.3e, all gradients %.3e\n", static_cast<long long>(chunk), loss_diff,
                grad_diff);
    EXPECT_LE(loss_diff, tolerance);
    EXPECT_LE(grad_diff, tolerance);
    // Evaluation takes the chunked path under no_grad and gives the same sums.
    torch::NoGradGuard no_grad;
    const auto eval = model.evaluate(batch);
    EXPECT_EQ(eval.count.item<int64_t>(), plain.count);
    EXPECT_LE(std::abs(eval.loss_sum.item<double>() - plain.loss) / std::abs(plain.loss), tolerance);
  }
  model.set_loss_chunk_tokens(0);
}

// Each architecture in each dtype, unpadded and left-padded.
class ChunkedCrossEntropyModelDtypes : public ::testing::TestWithParam<gradaccum::testing::DtypeCase> {};

TEST_P(ChunkedCrossEntropyModelDtypes, Gpt2GradientsEqualPlainLoss) {
  for (const bool left_padded : {false, true}) {
    expect_model_chunking_exact(CausalLm(Gpt2LmHeadModel(tiny_gpt2_config())), GetParam().dtype, left_padded,
                                GetParam().tolerance);
  }
}

TEST_P(ChunkedCrossEntropyModelDtypes, BloomGradientsEqualPlainLoss) {
  for (const bool left_padded : {false, true}) {
    expect_model_chunking_exact(CausalLm(BloomForCausalLm(tiny_bloom_config())), GetParam().dtype, left_padded,
                                GetParam().tolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(, ChunkedCrossEntropyModelDtypes, gradaccum::testing::dtype_cases(1e-10, 1e-5),
                         gradaccum::testing::dtype_case_name);

// loss_chunk_tokens 0 picks the chunk whose float32 logits take ~64 MiB.
TEST(ChunkedCrossEntropyModel, AutomaticChunkKeepsFloat32LogitsNear64MiB) {
  auto config = tiny_gpt2_config();
  config.vocab_size = 50257;
  CausalLm gpt2_vocab{Gpt2LmHeadModel(config)};
  EXPECT_EQ(gpt2_vocab.chunk_tokens(), 333);  // 64 MiB / (50257 × 4 B)
  config.vocab_size = 8192;
  CausalLm small_vocab(Gpt2LmHeadModel(config), 0);
  EXPECT_EQ(small_vocab.chunk_tokens(), 2048);
  small_vocab.set_loss_chunk_tokens(7);
  EXPECT_EQ(small_vocab.chunk_tokens(), 7);
}

}  // namespace chunked_cross_entropy_test
