// Per-sample dropout (models/sample_dropout.h): the mask is the documented pure function of
// (seed, step, sample, site, position), the same sample gets the same mask wherever it sits in a
// micro-batch and however long the micro-batch is padded, checkpointed blocks recompute the same
// masks, the HF config names travel through config.json, and `verify` passes with dropout 0.1 on
// GPT-2, BLOOM and the CNN (while libtorch's dropout does not).
#include "gradaccum/models/sample_dropout.h"

#include <gtest/gtest.h>

#include <cmath>

#include "gradaccum/models/bloom.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/models/hf_checkpoint.h"
#include "test_support.h"
#include "tiny_decoders.h"

namespace sample_dropout_test {

namespace core = gradaccum::core;
namespace models = gradaccum::models;
namespace support = gradaccum::testing;
using support::run_cli;

// The documented generator with uint64 arithmetic, one element at a time.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
bool kept(uint64_t seed, int64_t step, int64_t sample, int64_t site, uint64_t position, double p) {
  constexpr uint64_t g = 0x9E3779B97F4A7C15ULL;
  const uint64_t base = mix(mix(seed ^ (static_cast<uint64_t>(site + 1) * g)) + static_cast<uint64_t>(step) * g);
  const uint64_t row = mix(static_cast<uint64_t>(sample) * g + base);
  const uint64_t z = mix(row + (position + 1) * g);
  return static_cast<int64_t>(z >> 40) >= std::llround(p * (1 << 24));
}

core::SampleKeys keys(std::vector<int64_t> ids, int64_t step = 3, uint64_t seed = 42) {
  return {torch::tensor(ids, torch::kLong), step, seed};
}

TEST(SampleDropout, TheMaskIsTheDocumentedFunctionOfSeedStepSampleSiteAndPosition) {
  const auto x = torch::ones({3, 5, 7}, torch::kDouble);
  const auto k = keys({11, 0, 123456789});
  const auto scale = models::per_sample_dropout_scale(x, 0.25, k, 4);
  auto s = scale.accessor<double, 3>();
  int64_t dropped = 0;
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t t = 0; t < 5; ++t) {
      for (int64_t c = 0; c < 7; ++c) {
        const bool keep = kept(42, 3, k.ids[r].item<int64_t>(), 4, (static_cast<uint64_t>(t) << 16) + c, 0.25);
        ASSERT_EQ(s[r][t][c], keep ? 1.0 / 0.75 : 0.0) << r << " " << t << " " << c;
        dropped += keep ? 0 : 1;
      }
    }
  }
  EXPECT_GT(dropped, 0);
  // Four dimensions: (h · 2^16 + q) · 2^16 + k.
  const auto probabilities = torch::ones({2, 2, 3, 3}, torch::kFloat);
  const auto four = models::per_sample_dropout_scale(probabilities, 0.5, keys({5, 9}), 1);
  auto f = four.accessor<float, 4>();
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t q = 0; q < 3; ++q) {
      for (int64_t j = 0; j < 3; ++j) {
        const uint64_t position = ((static_cast<uint64_t>(h) << 16) + q << 16) + j;
        ASSERT_EQ(f[1][h][q][j], kept(42, 3, 9, 1, position, 0.5) ? 2.0f : 0.0f) << h << q << j;
      }
    }
  }
}

TEST(SampleDropout, ASampleGetsItsMaskWhereverItSitsAndHoweverLongThePadding) {
  const auto a = models::per_sample_dropout_scale(torch::ones({2, 5, 8}), 0.1, keys({7, 3}), 2);
  const auto b = models::per_sample_dropout_scale(torch::ones({3, 9, 8}), 0.1, keys({3, 11, 7}), 2);
  EXPECT_TRUE(torch::equal(a[0], b[2].slice(0, 0, 5)));
  EXPECT_TRUE(torch::equal(a[1], b[0].slice(0, 0, 5)));
  EXPECT_FALSE(torch::equal(b[0], b[2]));
  // Another step, site or seed draws another mask.
  EXPECT_FALSE(torch::equal(a, models::per_sample_dropout_scale(torch::ones({2, 5, 8}), 0.1, keys({7, 3}, 4), 2)));
  EXPECT_FALSE(torch::equal(a, models::per_sample_dropout_scale(torch::ones({2, 5, 8}), 0.1, keys({7, 3}), 3)));
  EXPECT_FALSE(torch::equal(a, models::per_sample_dropout_scale(torch::ones({2, 5, 8}), 0.1, keys({7, 3}, 3, 43), 2)));
  // The kept fraction is 1 - p: 0.9 ± 5 standard deviations over 400 000 elements.
  const auto many =
      models::per_sample_dropout_scale(torch::ones({100, 4000}), 0.1, keys(std::vector<int64_t>(100, 1)), 0);
  const double fraction = many.ne(0).to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(fraction, 0.9, 5 * std::sqrt(0.09 / 400000.0));
  // Identical ids give identical rows: the mask is the sample's, not the row's.
  EXPECT_TRUE(torch::equal(many[0], many[99]));
}

TEST(SampleDropout, EvalModeAndZeroAreTheIdentityAndMissingKeysAreAnError) {
  models::SampleDropout drop(0.5, 0, models::DropoutRng::per_sample);
  const auto x = torch::randn({2, 3});
  drop->eval();
  EXPECT_TRUE(torch::equal(drop->forward(x), x));
  drop->train();
  EXPECT_EQ(support::error_of([&] { drop->forward(x); }),
            "per-sample dropout: the micro-batch has 2 rows and 0 sample ids (model.dropout_rng per_sample needs the "
            "engine's sample keys)");
  models::SampleDropout none(0.0, 0, models::DropoutRng::per_sample);
  EXPECT_TRUE(torch::equal(none->forward(x), x));
  EXPECT_EQ(support::error_of([] { models::SampleDropout(1.0, 0, models::DropoutRng::per_sample); }),
            "key 'dropout': a dropout probability must be in [0, 1), got 1");
}

// Three rows of 10 token ids, the second padded after 6.
core::Batch padded_batch() {
  core::Batch batch;
  batch.input = torch::randint(1, 64, {3, 10}, at::detail::createCPUGenerator(5), torch::kLong);
  batch.attention_mask = torch::ones({3, 10}, torch::kLong);
  batch.attention_mask.slice(1, 6, 10)[1].fill_(0);
  batch.target = batch.input.masked_fill(batch.attention_mask.eq(0), -100);
  return batch;
}

// Loss and gradients of one padded micro-batch of the tiny GPT-2 with every dropout at 0.1.
struct Outcome {
  double loss;
  torch::Tensor grads;
};
Outcome gpt2_step(bool checkpointed, models::DropoutRng rng) {
  auto config = support::tiny_gpt2_config();
  config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.1;
  config.dropout_rng = rng;
  models::CausalLm model{models::Gpt2LmHeadModel(config)};
  model.model()->transformer->set_gradient_checkpointing(checkpointed);
  model.module().to(torch::kDouble);
  auto batch = padded_batch();
  batch.keys = keys({4, 8, 15});
  torch::manual_seed(0);
  const auto l = model.loss(batch);
  l.sum.backward();
  return {l.sum.item<double>(), support::flat_grads(model.module())};
}

TEST(SampleDropout, ACheckpointedBlockRecomputesTheSameMasks) {
  const auto plain = gpt2_step(false, models::DropoutRng::per_sample);
  const auto checkpointed = gpt2_step(true, models::DropoutRng::per_sample);
  EXPECT_EQ(plain.loss, checkpointed.loss);
  EXPECT_LE(support::max_relative_difference(checkpointed.grads, plain.grads), 1e-14);
  // Dropout is on: the loss is not the one without it.
  auto config = support::tiny_gpt2_config();
  models::CausalLm bare{models::Gpt2LmHeadModel(config)};
  bare.module().to(torch::kDouble);
  EXPECT_GT(std::abs(bare.loss(padded_batch()).sum.item<double>() - plain.loss), 1e-3);
}

TEST(SampleDropout, HfConfigNamesAreWrittenAndRead) {
  auto gpt2 = support::tiny_gpt2_config();
  gpt2.resid_pdrop = 0.2;
  gpt2.embd_pdrop = 0.05;
  gpt2.attn_pdrop = 0.125;
  const auto j = models::gpt2_hf_config(gpt2);
  EXPECT_EQ(j["resid_pdrop"], 0.2);
  EXPECT_EQ(j["attn_pdrop"], 0.125);
  const auto back = models::gpt2_config_from_hf(j, "j");
  EXPECT_EQ(back.resid_pdrop, 0.2);
  EXPECT_EQ(back.embd_pdrop, 0.05);
  EXPECT_EQ(back.attn_pdrop, 0.125);
  auto absent = j;
  absent.erase("resid_pdrop");
  EXPECT_EQ(models::gpt2_config_from_hf(absent, "j").resid_pdrop, 0.1);  // HF's GPT2Config default
  absent["attn_pdrop"] = 1.5;
  EXPECT_EQ(support::error_of([&] { models::gpt2_config_from_hf(absent, "j"); }),
            "j: config.json \"attn_pdrop\" must be a probability in [0, 1), got 1.5");
  auto bloom = support::tiny_bloom_config();
  bloom.hidden_dropout = 0.1;
  bloom.attention_dropout = 0.3;
  const auto b = models::bloom_config_from_hf(models::bloom_hf_config(bloom), "b");
  EXPECT_EQ(b.hidden_dropout, 0.1);
  EXPECT_EQ(b.attention_dropout, 0.3);
}

const std::string kTinyGpt2 =
    "--set model.type=gpt2 --set model.n_layer=1 --set model.n_embd=16 --set model.n_head=2 "
    "--set model.n_positions=32 --set data.type=kjv --set data.max_length=16 --set data.train_limit=96 "
    "--set threads=2 --set learning_rate=1e-2 --set seed=7";
const std::string kGpt2Dropout =
    kTinyGpt2 + " --set model.resid_pdrop=0.1 --set model.embd_pdrop=0.1 --set model.attn_pdrop=0.1";
const std::string kBloomDropout =
    "--set model.type=bloom --set model.n_layer=1 --set model.n_embd=16 --set model.n_head=2 --set data.type=kjv "
    "--set data.max_length=16 --set data.train_limit=96 --set threads=2 --set learning_rate=1e-2 --set seed=7 "
    "--set model.hidden_dropout=0.1 --set model.attention_dropout=0.1";
const std::string kCnnDropout =
    "--set model.type=cnn --set model.norm=group --set model.channels=[4,8] --set model.hidden=[16] "
    "--set data.train_limit=96 --set threads=2 --set learning_rate=3e-3 --set model.dropout=0.1";

void expect_verify(const std::string& model, bool exact) {
  const auto r = run_cli("verify --splits 32x1,8x4,2x16 --steps 2 --tolerance 1e-10 " + model);
  EXPECT_EQ(r.exit_code, exact ? 0 : 1) << r.out << r.err;
  EXPECT_NE(r.out.find(exact ? "exact: every split follows" : "DIFFERS"), std::string::npos) << r.out;
}

TEST(SampleDropoutRuns, VerifyPassesWithDropoutOnGpt2BloomAndTheCnn) {
  expect_verify(kGpt2Dropout, true);
  expect_verify(kBloomDropout, true);
  expect_verify(kCnnDropout, true);
}

TEST(SampleDropoutRuns, WithLibtorchsDropoutTheSplitsDiffer) {
  expect_verify(kGpt2Dropout + " --set model.dropout_rng=libtorch", false);
  expect_verify(kBloomDropout + " --set model.dropout_rng=libtorch", false);
}

// The CNN's one dropout site draws, in one process, consecutive elements of one generator whatever
// the cut (32 rows at once or 4 × 8 one after the other), so `verify` cannot tell; two ranks can:
// their generators are seeded alike, and rank 1 repeats rank 0's masks.
TEST(SampleDropoutRuns, TwoRanksTrainAsOneWithPerSampleDropoutOnly) {
  const auto dir = support::make_temp_dir("dropout-ranks");
  const auto run = kCnnDropout +
                   " --set dtype=float64 --set max_steps=3 --set data.eval_limit=-1 "
                   "--set per_device_train_batch_size=16 --set threads=1";
  for (const std::string rng : {"per_sample", "libtorch"}) {
    const auto one = support::train_steps(run + " --set gradient_accumulation_steps=2 --set model.dropout_rng=" + rng,
                                          dir + "/one-" + rng);
    const auto two = support::train_steps(
        run + " --set gradient_accumulation_steps=1 --nproc 2 --set model.dropout_rng=" + rng, dir + "/two-" + rng);
    ASSERT_EQ(one.size(), 3u);
    ASSERT_EQ(two.size(), 3u);
    double largest = 0.0;
    for (size_t i = 0; i < one.size(); ++i) {
      largest =
          std::max(largest, support::relative_difference(two[i]["loss"].get<double>(), one[i]["loss"].get<double>()));
      largest = std::max(
          largest, support::relative_difference(two[i]["grad_norm"].get<double>(), one[i]["grad_norm"].get<double>()));
    }
    if (rng == "per_sample") {
      EXPECT_LE(largest, 1e-10);
    } else {
      EXPECT_GT(largest, 1e-6);
    }
  }
}

TEST(SampleDropoutRuns, TheConfigNamesTheMisplacedKey) {
  const auto r = run_cli("train " + kTinyGpt2 + " --set model.hidden_dropout=0.1 --set max_steps=1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "gradaccum: error: key 'model.hidden_dropout': a BLOOM setting; GPT-2's dropouts are resid_pdrop, "
            "embd_pdrop and attn_pdrop\n");
  const auto p = run_cli("train " + kTinyGpt2 + " --set model.resid_pdrop=1.0 --set max_steps=1");
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_EQ(
      p.err,
      "gradaccum: error: key 'model.resid_pdrop': must be in [0, 1), or -1 for the checkpoint's (else 0), got 1\n");
}

}  // namespace sample_dropout_test
