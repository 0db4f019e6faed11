// The Llama family (llama, qwen2, qwen3, mistral) through the program: `verify` finds
// decompositions of padded KJV verses exact in float64, a tiny Llama trains (its loss falls)
// and its final/ checkpoint loads back with the same logits, and a misplaced model key is
// refused naming the family's keys.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "gradaccum/models/built_model.h"
#include "test_support.h"

namespace llama_family_cli_test {

using gradaccum::testing::make_temp_dir;
using gradaccum::testing::run_cli;
namespace fs = std::filesystem;

// A tiny Llama with grouped-query attention (6 query heads, 2 key-value heads) on the first
// verses cut to 16 tokens, so every micro-batch is padded differently.
const std::string kTinyLlama =
    "--set model.type=llama --set model.n_layer=2 --set model.n_embd=24 --set model.n_head=6 "
    "--set model.n_kv_head=2 --set model.intermediate_size=40 --set model.n_positions=32 --set data.type=kjv "
    "--set data.max_length=16 --set data.train_limit=64 --set data.eval_limit=-1 --set threads=2 "
    "--set learning_rate=1e-2 --set seed=7";

TEST(LlamaFamilyCli, VerifyFindsPaddedSplitsExactInFloat64) {
  for (const std::string family : {"llama", "qwen2", "qwen3", "mistral"}) {
    std::string model = kTinyLlama + " --set model.type=" + family;
    if (family == "mistral") model += " --set model.sliding_window=5";  // shorter than the rows
    if (family == "qwen3") model += " --set model.head_dim=6";          // unequal to 24 / 6
    const auto r = run_cli("verify --splits 16x1,4x4,1x16 --steps 2 " + model);
    EXPECT_EQ(r.exit_code, 0) << family << ":\n" << r.out << r.err;
    EXPECT_NE(r.out.find("exact: every split follows the full-batch trajectory"), std::string::npos) << family << ":\n"
                                                                                                     << r.out;
  }
}

TEST(LlamaFamilyCli, TrainsAndItsFinalCheckpointLoadsWithTheSameLogits) {
  const auto dir = make_temp_dir("llama-train");
  const auto steps = gradaccum::testing::train_steps(
      kTinyLlama + " --set per_device_train_batch_size=8 --set gradient_accumulation_steps=2 --set max_steps=6",
      dir + "/run");
  ASSERT_EQ(steps.size(), 6u);
  EXPECT_LT(steps.back()["loss"].get<double>(), steps.front()["loss"].get<double>() - 0.1);
  const auto final_dir = dir + "/run/final";
  ASSERT_TRUE(fs::exists(final_dir + "/config.json"));
  auto model = gradaccum::models::load_language_model(final_dir, -1, 0);
  EXPECT_EQ(model.architecture, "llama");
  EXPECT_EQ(model.hf_config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(model.hf_config["num_key_value_heads"], 2);
  // HF's names: the backbone under model., a tied head (a fresh model's) not written.
  const auto weights = model.weights();
  EXPECT_EQ(weights.front().first, "model.embed_tokens.weight");
  for (const auto& [name, tensor] : weights) EXPECT_EQ(name.rfind("model.", 0), 0u) << name;
  fs::remove_all(dir);
}

TEST(LlamaFamilyCli, AnotherFamilysDropoutKeyIsRefusedNamingThisOnes) {
  const auto r = run_cli("train " + kTinyLlama + " --set model.resid_pdrop=0.1 --set max_steps=1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "gradaccum: error: key 'model.resid_pdrop': a GPT-2 setting; Llama's dropouts are attention_dropout\n");
  const auto window = run_cli("train " + kTinyLlama + " --set model.sliding_window=4 --set max_steps=1");
  EXPECT_EQ(window.exit_code, 1);
  EXPECT_EQ(window.err, "gradaccum: error: key 'model.sliding_window': llama has no sliding window\n");
}

}  // namespace llama_family_cli_test
