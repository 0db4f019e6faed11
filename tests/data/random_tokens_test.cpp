// data.type random_tokens: the seeded synthetic LM corpus (data/random_tokens.h),
// its configuration keys and errors, and a GPT-2 trained on it through the
// program with the vocabulary taken from data.vocab_size (no tokenizer).
#include "gradaccum/data/random_tokens.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "gradaccum/io/config.h"
#include "test_support.h"

namespace random_tokens_test {

using gradaccum::data::make_random_tokens_data;
using gradaccum::data::RandomTokensDataset;
using gradaccum::data::RandomTokensOptions;
using gradaccum::testing::error_of;
using gradaccum::testing::make_temp_dir;
using gradaccum::testing::run_cli;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

RandomTokensOptions options(int64_t vocab, int64_t length, int64_t rows, uint64_t seed) {
  RandomTokensOptions o;
  o.vocab_size = vocab;
  o.max_length = length;
  o.rows = rows;
  o.seed = seed;
  return o;
}

TEST(RandomTokens, SameSeedSameRowsOtherSeedOtherRows) {
  const RandomTokensDataset a(options(100, 16, 32, 42));
  const RandomTokensDataset b(options(100, 16, 32, 42));
  const RandomTokensDataset c(options(100, 16, 32, 43));
  EXPECT_TRUE(torch::equal(a.ids(), b.ids()));
  // Two independent uniform draws agree on about 1 in 100 ids.
  const auto same = a.ids().eq(c.ids()).sum().item<int64_t>();
  EXPECT_LT(same, 32 * 16 / 20) << same << " of " << 32 * 16 << " ids equal";
  // A row depends on (seed, row) alone, not on how many rows there are.
  const RandomTokensDataset prefix(options(100, 16, 5, 42));
  EXPECT_TRUE(torch::equal(prefix.ids(), a.ids().slice(0, 0, 5)));
  // Rows differ from one another (the counter advances).
  EXPECT_FALSE(torch::equal(a.ids()[0], a.ids()[1]));
}

TEST(RandomTokens, IdsCoverTheVocabularyAndNothingElse) {
  const RandomTokensDataset data(options(7, 64, 50, 1));
  EXPECT_EQ(data.ids().min().item<int64_t>(), 0);
  EXPECT_EQ(data.ids().max().item<int64_t>(), 6);
  // 3200 uniform draws of 7 ids: each id about 457 times (sd ≈ 20).
  const auto counts = torch::bincount(data.ids().flatten(), {}, 7);
  EXPECT_GT(counts.min().item<int64_t>(), 350);
  EXPECT_LT(counts.max().item<int64_t>(), 570);
  // The 8192-id vocabulary of the GPT benchmark.
  const RandomTokensDataset big(options(8192, 128, 64, 42));
  EXPECT_GE(big.ids().min().item<int64_t>(), 0);
  EXPECT_LT(big.ids().max().item<int64_t>(), 8192);
  // 8192 draws of 8192 ids: about 1 − 1/e of the ids (5178) appear.
  EXPECT_GT(torch::bincount(big.ids().flatten(), {}, 8192).gt(0).sum().item<int64_t>(), 4900);
}

TEST(RandomTokens, BatchShapesLabelsEqualInputsNoMask) {
  const RandomTokensDataset data(options(50, 12, 10, 3));
  EXPECT_EQ(data.size(), 10);
  const auto batch = data.get(torch::tensor({4, 0, 4}, torch::kLong), torch::kFloat);
  ASSERT_EQ(batch.input.sizes(), (std::vector<int64_t>{3, 12}));
  EXPECT_EQ(batch.input.scalar_type(), torch::kLong);
  EXPECT_EQ(batch.samples, 3);
  EXPECT_TRUE(torch::equal(batch.target, batch.input));
  EXPECT_FALSE(batch.attention_mask.defined());
  EXPECT_TRUE(torch::equal(batch.input[0], data.ids()[4]));
  EXPECT_TRUE(torch::equal(batch.input[1], data.ids()[0]));
  EXPECT_TRUE(torch::equal(data.sample_lengths(), torch::full({10}, 12, torch::kLong)));
  EXPECT_THAT(error_of([&] { data.get(torch::tensor({10}, torch::kLong), torch::kFloat); }),
              HasSubstr("random tokens: sample index out of range [0, 10)"));
}

TEST(RandomTokens, EvalSplitContinuesTheStreamWithoutOverlap) {
  const auto split = make_random_tokens_data(100, 8, 20, 5, 9);
  ASSERT_NE(split.eval, nullptr);
  EXPECT_EQ(split.train->size(), 20);
  EXPECT_EQ(split.eval->size(), 5);
  const RandomTokensDataset all(options(100, 8, 25, 9));
  EXPECT_TRUE(torch::equal(split.train->ids(), all.ids().slice(0, 0, 20)));
  EXPECT_TRUE(torch::equal(split.eval->ids(), all.ids().slice(0, 20, 25)));
  EXPECT_EQ(make_random_tokens_data(100, 8, 20, 0, 9).eval, nullptr);
}

TEST(RandomTokens, BadOptionsAreNamed) {
  EXPECT_THAT(error_of([] { std::make_shared<RandomTokensDataset>(options(1, 8, 4, 0)); }),
              HasSubstr("random tokens: vocab_size must be >= 2, got 1"));
  EXPECT_THAT(error_of([] { std::make_shared<RandomTokensDataset>(options(10, 1, 4, 0)); }),
              HasSubstr("random tokens: max_length must be >= 2"));
  EXPECT_THAT(error_of([] { std::make_shared<RandomTokensDataset>(options(10, 8, 0, 0)); }),
              HasSubstr("random tokens: rows must be >= 1, got 0"));
}

// The language-model keys of a random_tokens run, plus `extra`.
std::vector<std::string> lm_overrides(std::vector<std::string> extra) {
  std::vector<std::string> o = {"model.type=gpt2", "data.type=random_tokens", "data.vocab_size=64"};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

TEST(RandomTokensConfig, KeysParseWithDefaults) {
  const auto c = gradaccum::io::load_config("", lm_overrides({"data.max_length=32"}));
  EXPECT_EQ(c.data.type, "random_tokens");
  EXPECT_EQ(c.data.vocab_size, 64);
  EXPECT_EQ(c.data.train_size, 4096);
  EXPECT_EQ(c.data.max_length, 32);
  const auto d = gradaccum::io::load_config("", lm_overrides({"data.train_size=100"}));
  EXPECT_EQ(d.data.train_size, 100);
}

TEST(RandomTokensConfig, ErrorsNameTheKey) {
  using gradaccum::io::load_config;
  EXPECT_EQ(error_of([] {
              load_config("", {"model.type=gpt2", "data.type=random_tokens"});
            }),
            "key 'data.vocab_size': must be >= 2 with data.type random_tokens, got 0");
  EXPECT_EQ(error_of([] { load_config("", lm_overrides({"data.vocab_size=1"})); }),
            "key 'data.vocab_size': must be >= 2 with data.type random_tokens, got 1");
  EXPECT_EQ(error_of([] { load_config("", lm_overrides({"data.vocab_size=many"})); }),
            "key 'data.vocab_size': expected an integer, got 'many'");
  EXPECT_EQ(error_of([] { load_config("", lm_overrides({"data.train_size=0"})); }),
            "key 'data.train_size': must be >= 1, got 0");
  EXPECT_EQ(error_of([] { load_config("", lm_overrides({"sample.prompt=Hello"})); }),
            "key 'sample.prompt': data.type random_tokens has no tokenizer to encode a prompt; leave it \"\"");
  // Only random_tokens takes its vocabulary from the configuration.
  EXPECT_EQ(error_of([] {
              load_config("", {"model.type=gpt2", "data.type=kjv", "data.vocab_size=64"});
            }),
            "key 'data.vocab_size': must be 0 unless data.type is random_tokens (the tokenizer's), got 64");
  // Random tokens are language-model data.
  EXPECT_THAT(error_of([] {
                load_config("", {"data.type=random_tokens", "data.vocab_size=64"});
              }),
              HasSubstr("key 'data.type': random_tokens data needs a language model"));
  EXPECT_THAT(error_of([] { load_config("", lm_overrides({"data.type=random"})); }),
              HasSubstr("key 'data.type': 'random' is not one of"));
}

// Two optimizer steps of a tiny GPT-2 through `gradaccum train` (make_workload):
// the model's vocabulary is data.vocab_size, no tokenizer is loaded or copied,
// and the first loss is close to ln(vocab_size) (untrained on uniform ids).
TEST(RandomTokensTrain, TwoStepsBuildAModelOfTheDataVocabulary) {
  const auto dir = make_temp_dir("random-tokens-train");
  const std::string args =
      "train --set model.type=gpt2 --set model.n_layer=1 --set model.n_embd=16 --set model.n_head=2 "
      "--set model.n_positions=32 --set data.type=random_tokens --set data.vocab_size=97 "
      "--set data.max_length=32 --set data.train_size=64 --set per_device_train_batch_size=4 "
      "--set gradient_accumulation_steps=2 --set max_steps=2 --set threads=1 "
      "--set data.tokenizer=/nonexistent/tokenizer --set output_dir=" +
      dir + "/run";
  const auto r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out + r.err, HasSubstr("random tokens: 64 rows of 32 ids in [0, 97), seed 42"));
  const auto config = nlohmann::json::parse(gradaccum::testing::read_text(dir + "/run/final/config.json"));
  EXPECT_EQ(config["vocab_size"], 97);
  EXPECT_FALSE(fs::exists(dir + "/run/final/tokenizer.json"));
  EXPECT_FALSE(fs::exists(dir + "/run/final/gpt2.tiktoken"));
  const auto steps = gradaccum::testing::step_records(dir + "/run/metrics.jsonl");
  ASSERT_EQ(steps.size(), 2u);
  // 8 rows of 31 predicted tokens per window.
  EXPECT_EQ(steps[0]["items"], 8 * 31);
  EXPECT_NEAR(steps[0]["loss"].get<double>(), std::log(97.0), 0.1);
  // Evaluation ran on the split of ⌊64 · 0.1⌋ = 6 further rows.
  bool evaluated = false;
  for (const auto& record : gradaccum::testing::read_jsonl(dir + "/run/metrics.jsonl")) {
    if (record.contains("eval_loss")) evaluated = true;
  }
  EXPECT_TRUE(evaluated);
  fs::remove_all(dir);
}

}  // namespace random_tokens_test
