// max_tokens_per_micro_batch (core/window_plan.h): a window's samples cut into micro-batches of at
// most K padded tokens. The cut follows the documented greedy rule, the training equals the plain
// cut's in float64 while the micro-steps and the padding change, and memory follows K, not b.
#include <gtest/gtest.h>

#include <cmath>

#include "gradaccum/core/window_plan.h"
#include "test_support.h"

namespace token_budget_test {

using gradaccum::core::BatchGeometry;
using gradaccum::core::Window;
using gradaccum::testing::make_temp_dir;
using gradaccum::testing::run_cli;
using gradaccum::testing::step_records;

TEST(TokenBudget, ChunksTakeSamplesWhileRowsTimesLongestFitK) {
  // Lengths in window order 10, 9, 5, 5, 3, 2 with K = 20: [10, 9] is 2 × 10 = 20; a third row
  // would make 30, so [5, 5, 3, 2] (4 × 5 = 20) is the second micro-batch.
  const auto lengths = torch::tensor({10, 9, 5, 5, 3, 2}, torch::kLong);
  const auto samples = torch::arange(6, torch::kLong);
  const Window one(0, 0, samples, BatchGeometry::from_accumulation(4, 2), 20, lengths);
  EXPECT_EQ(one.micro_steps(), 2);
  EXPECT_TRUE(torch::equal(one.micro_batch(0), torch::tensor({0, 1}, torch::kLong)));
  EXPECT_TRUE(torch::equal(one.micro_batch(1), torch::tensor({2, 3, 4, 5}, torch::kLong)));
  EXPECT_EQ(one.padded_tokens(), 40);
  EXPECT_EQ(one.sample_tokens(), 34);
  // Two ranks: chunk c goes to rank c % 2 at micro-step c / 2.
  const Window two(0, 0, samples, BatchGeometry::from_accumulation(4, 1, 2), 20, lengths);
  EXPECT_EQ(two.micro_steps(), 1);
  EXPECT_TRUE(torch::equal(two.micro_batch(0, 1), torch::tensor({2, 3, 4, 5}, torch::kLong)));
  // K = 9: a sample longer than K is a micro-batch of its own, [10]; then [9], [5], [5] (two 5s
  // make 10), and [3, 2] (2 × 3 = 6).
  const Window tight(0, 0, samples, BatchGeometry::from_accumulation(4, 2), 9, lengths);
  EXPECT_EQ(tight.micro_steps(), 5);
  EXPECT_TRUE(torch::equal(tight.micro_batch(0), torch::tensor({0}, torch::kLong)));
  EXPECT_TRUE(torch::equal(tight.micro_batch(4), torch::tensor({4, 5}, torch::kLong)));
  EXPECT_EQ(tight.padded_tokens(), 10 + 9 + 5 + 5 + 2 * 3);
}

// The KJV GPT-2 in float64 on its verses (dynamic padding), sorted by length inside each window,
// logits unchunked up to 4096 tokens so that memory follows the micro-batch's tokens.
const std::string kKjv =
    "train " + std::string(GRADACCUM_TEST_DATA) +
    "/../../configs/kjv-gpt2.yaml --set threads=1 --set dtype=float64 --set max_steps=4 "
    "--set eval_steps=0 --set data.eval_limit=-1 --set sample.prompt= --set loss_chunk_tokens=4096 "
    "--set per_device_train_batch_size=32 --set gradient_accumulation_steps=1";

TEST(TokenBudget, TrainsAsThePlainCutWithOtherMicroStepsAndLessMemory) {
  const auto dir = make_temp_dir("token-budget");
  const auto plain = run_cli(kKjv + " --set output_dir=" + dir + "/plain");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const auto budget = run_cli(kKjv + " --set max_tokens_per_micro_batch=128 --set output_dir=" + dir + "/budget");
  ASSERT_EQ(budget.exit_code, 0) << budget.err;
  const auto a = step_records(dir + "/plain/metrics.jsonl"), b = step_records(dir + "/budget/metrics.jsonl");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i]["loss"].get<double>(), a[i]["loss"].get<double>(), 1e-10 * a[i]["loss"].get<double>()) << i;
    EXPECT_NEAR(b[i]["grad_norm"].get<double>(), a[i]["grad_norm"].get<double>(),
                1e-10 * a[i]["grad_norm"].get<double>())
        << i;
    EXPECT_EQ(b[i]["items"], a[i]["items"]);
    // One micro-batch of 32 rows in the plain cut; micro-batches of at most 128 padded tokens here.
    EXPECT_EQ(a[i]["micro_steps"].get<int64_t>(), 1);
    const int64_t steps = b[i]["micro_steps"].get<int64_t>(), padded = b[i]["padded_tokens"].get<int64_t>();
    EXPECT_LE(padded, 128 * steps) << i;
    EXPECT_GE(steps, (a[i]["padded_tokens"].get<int64_t>() * (1.0 - a[i]["padding_fraction"].get<double>())) / 128.0)
        << i;
    EXPECT_GT(steps, 1) << i;
    // Cut into shorter runs of similar lengths, the window wastes less padding.
    EXPECT_LE(padded, a[i]["padded_tokens"].get<int64_t>()) << i;
  }
  const auto peak = [&](const std::string& run) {
    return nlohmann::json::parse(gradaccum::testing::read_text(dir + "/" + run + "/summary.json"))["peak_rss_mb"]
        .get<double>();
  };
  // 32 verses at once hold their float64 logits for ~32 × 40 tokens × 50257; 128 tokens hold ~1/10.
  EXPECT_LT(peak("budget") + 200.0, peak("plain")) << "peak RSS " << peak("budget") << " vs " << peak("plain") << " MB";

  const auto both = run_cli(kKjv + " --set max_tokens_per_micro_batch=128 --set deterministic_accumulation=true");
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_EQ(both.err,
            "gradaccum: error: key 'max_tokens_per_micro_batch': cannot be combined with "
            "deterministic_accumulation (the number of micro-batches per rank would depend on the world size)\n");
}

}  // namespace token_budget_test
