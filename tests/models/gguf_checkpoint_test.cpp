// GGUF files as Llama checkpoints (models/gguf_checkpoint.h) against transformers' GGUF loader
// (AutoModelForCausalLM.from_pretrained(dir, gguf_file=name); tests/hf/gguf_transformers_reference.py
// runs it with the venv's Python): a tiny Llama that gguf's GGUFWriter wrote (grouped-query
// attention, an untied head, Q8_0 / F16 / F32 weights) and SmolLM2-135M-Instruct (installed by
// scripts/setup.sh; those tests skip without it) give transformers' logits on a right-padded
// batch, and `gradaccum generate` continues a prompt greedily as transformers' generate does.
// Then the files a loader must refuse, each with a one-line error naming the file and the key
// or tensor.
#include "gradaccum/models/gguf_checkpoint.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "gguf_reference.h"
#include "gradaccum/core/batch.h"
#include "gradaccum/formats/safetensors.h"
#include "gradaccum/models/built_model.h"
#include "gradaccum/models/causal_lm.h"
#include "test_support.h"

namespace gguf_checkpoint_test {

namespace fs = std::filesystem;
using namespace gradaccum;
using gradaccum::testing::error_of;

using gradaccum::testing::kSmolLm2Path;

std::string read_bytes(const std::string& path) { return gradaccum::testing::file_bytes(path); }

using Reference = gradaccum::testing::GgufReference;
using gradaccum::testing::run_gguf_reference;

// The tiny Llama and the refused files (~10 s), once per test process.
const Reference& synthetic() {
  static const Reference r = run_gguf_reference("gguf-models", "models");
  return r;
}
// transformers on SmolLM2-135M (~30 s), once per test process.
const Reference& smollm2() {
  static const Reference r = run_gguf_reference("gguf-smollm2", std::string("model '") + kSmolLm2Path + "'");
  return r;
}

torch::Tensor tensor_named(const formats::NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

// max |ours - theirs| / max |theirs| over the real (unpadded) tokens, and that scale.
std::pair<double, double> difference_over_real_tokens(const torch::Tensor& ours, const torch::Tensor& theirs,
                                                      const torch::Tensor& mask) {
  const auto real = mask.to(torch::kBool);
  const auto a = ours.index({real}).to(torch::kDouble), b = theirs.index({real}).to(torch::kDouble);
  const double scale = b.abs().max().item<double>();
  return {(a - b).abs().max().item<double>() / scale, scale};
}

// The logits of `path` loaded as a causal LM on the reference batch in `reference_file`.
void expect_transformers_logits(const std::string& path, const std::string& reference_file, double tolerance) {
  auto model = models::load_language_model(path, -1, 0);
  ASSERT_NE(model.causal_lm(), nullptr);
  const auto reference = formats::load_safetensors(reference_file);
  const auto ids = tensor_named(reference, "input_ids"), mask = tensor_named(reference, "attention_mask");
  const auto theirs = tensor_named(reference, "logits");
  // A padded batch: some rows shorter than others.
  ASSERT_LT(mask.sum(1).min().item<int64_t>(), mask.size(1));
  torch::NoGradGuard no_grad;
  model.task->module().eval();
  const auto ours = model.causal_lm()->forward(ids, mask);
  ASSERT_EQ(ours.sizes(), theirs.sizes());
  const auto [difference, scale] = difference_over_real_tokens(ours, theirs, mask);
  std::cout << "[ gguf ] " << path << ": logits within " << difference << " of transformers' (max |logit| " << scale
            << ")\n";
  EXPECT_LE(difference, tolerance);
  EXPECT_GT(scale, 0.5);
}

TEST(GgufCheckpoint, TinyLlamaGivesTransformersLogits) {
  ASSERT_EQ(synthetic().error, "");
  // float32 on both sides, from the same dequantized weights: only summation order differs.
  expect_transformers_logits(synthetic().dir + "/tiny-llama.gguf", synthetic().dir + "/tiny-llama.safetensors", 1e-5);
}

// An explicit head size (llama.attention.key_length 12, not width / heads = 8) and a tied head.
TEST(GgufCheckpoint, ExplicitHeadSizeGivesTransformersLogits) {
  ASSERT_EQ(synthetic().error, "");
  const auto path = synthetic().dir + "/tiny-llama-head-dim.gguf";
  const auto config = models::gguf_hf_config(formats::GgufFile::open(path));
  EXPECT_EQ(config["head_dim"], 12);
  EXPECT_EQ(config["tie_word_embeddings"], true);
  expect_transformers_logits(path, synthetic().dir + "/tiny-llama-head-dim.safetensors", 1e-5);
}

// llama.rope.scaling.* become rope_scaling; without llama.vocab_size the vocabulary is the
// tokenizer's tokens.
TEST(GgufCheckpoint, RopeScalingAndTheTokenizersVocabularyAreRead) {
  ASSERT_EQ(synthetic().error, "");
  const auto path = synthetic().dir + "/tiny-llama-rope-linear.gguf";
  const auto file = formats::GgufFile::open(path);
  ASSERT_FALSE(file.has("llama.vocab_size"));
  const auto config = models::gguf_hf_config(file);
  EXPECT_EQ(config["rope_scaling"], (nlohmann::json{{"rope_type", "linear"}, {"factor", 4.0}}));
  EXPECT_EQ(config["vocab_size"], 296);
  EXPECT_EQ(config["vocab_size"], file.array_size("tokenizer.ggml.tokens"));
  const auto model = models::load_language_model(path, -1, 0);
  EXPECT_EQ(model.vocab_size, 296);
  EXPECT_EQ(model.hf_config["rope_parameters"]["rope_type"], "linear");
  EXPECT_EQ(model.hf_config["rope_parameters"]["factor"], 4.0);
}

// `gradaccum eval --checkpoint FILE.gguf` on the reference texts: the mean loss of transformers'
// logits over the predicted tokens (each line a document, tokenized as transformers did).
TEST(GgufCheckpoint, EvalGivesTheLossOfTransformersLogits) {
  ASSERT_EQ(synthetic().error, "");
  const auto reference = formats::load_safetensors(synthetic().dir + "/tiny-llama.safetensors");
  const auto ids = tensor_named(reference, "input_ids"), mask = tensor_named(reference, "attention_mask");
  const auto logits = tensor_named(reference, "logits").to(torch::kDouble);
  const auto sum = models::causal_lm_loss(logits, ids.masked_fill(mask == 0, core::kIgnoreIndex));
  const double expected = (sum.sum / sum.count.to(torch::kDouble)).item<double>();
  const auto dir = gradaccum::testing::make_temp_dir("gguf-eval");
  std::ofstream(dir + "/texts.txt") << "the film and the light\nGod said ab <think>\nthe\n";
  const auto r = gradaccum::testing::run_cli("eval --checkpoint " + synthetic().dir + "/tiny-llama.gguf " + dir +
                                             "/texts.txt --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto result = nlohmann::json::parse(r.out);
  EXPECT_EQ(result["tokens"], sum.count.item<int64_t>());
  EXPECT_NEAR(result["loss"].get<double>(), expected, 1e-5 * expected);
  EXPECT_GT(expected, 1.0);
}

// llama.rope.scaling.* of YaRN (type, factor, original_context_length, yarn_beta_fast and
// yarn_beta_slow, as llama.cpp's converter writes them) become rope_scaling, and the model gives
// the logits of transformers built with those rope_parameters on the file's weights (its GGUF
// loader reads no scaling keys); without the scaling the logits differ by far more.
TEST(GgufCheckpoint, YarnRopeScalingGivesTransformersLogits) {
  ASSERT_EQ(synthetic().error, "");
  const auto path = synthetic().dir + "/tiny-llama-rope-yarn.gguf";
  const auto config = models::gguf_hf_config(formats::GgufFile::open(path));
  EXPECT_EQ(config["rope_scaling"], (nlohmann::json{{"rope_type", "yarn"},
                                                    {"factor", 4.0},
                                                    {"original_max_position_embeddings", 16},
                                                    {"beta_fast", 16.0},
                                                    {"beta_slow", 2.0}}));
  expect_transformers_logits(path, synthetic().dir + "/tiny-llama-rope-yarn.safetensors", 1e-5);
  const auto scaled = formats::load_safetensors(synthetic().dir + "/tiny-llama-rope-yarn.safetensors");
  const auto plain = formats::load_safetensors(synthetic().dir + "/tiny-llama.safetensors");
  const auto [difference, scale] = difference_over_real_tokens(
      tensor_named(scaled, "logits"), tensor_named(plain, "logits"), tensor_named(plain, "attention_mask"));
  EXPECT_GT(difference, 1e-2) << "YaRN changes nothing here (max |logit| " << scale << ")";
}

TEST(GgufCheckpoint, TinyLlamaConfigIsItsMetadata) {
  ASSERT_EQ(synthetic().error, "");
  const auto file = formats::GgufFile::open(synthetic().dir + "/tiny-llama.gguf");
  const auto config = models::gguf_hf_config(file);
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["hidden_size"], 32);
  EXPECT_EQ(config["intermediate_size"], 48);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["head_dim"], 8);
  EXPECT_EQ(config["max_position_embeddings"], 64);
  EXPECT_EQ(config["rope_theta"], 5000.0);
  EXPECT_EQ(config["rms_norm_eps"], static_cast<double>(1e-5f));
  EXPECT_EQ(config["vocab_size"], file.array_size("tokenizer.ggml.tokens"));
  EXPECT_EQ(config["tie_word_embeddings"], false);  // the file has an output tensor
  EXPECT_EQ(config["bos_token_id"], 1);
  EXPECT_EQ(config["eos_token_id"], 2);
  EXPECT_EQ(config["pad_token_id"], 5);
  // A classifier from it keeps the backbone and starts a fresh score head, as transformers does.
  auto classifier = models::load_language_model(synthetic().dir + "/tiny-llama.gguf", 3, 11);
  EXPECT_EQ(classifier.num_labels, 3);
  EXPECT_EQ(classifier.hf_config["architectures"][0], "LlamaForSequenceClassification");
}

TEST(GgufCheckpoint, SmolLm2GivesTransformersLogits) {
  REQUIRE_SMOLLM2();
  ASSERT_EQ(smollm2().error, "");
  expect_transformers_logits(kSmolLm2Path, smollm2().dir + "/reference.safetensors", 1e-4);
}

TEST(GgufCheckpoint, SmolLm2ConfigIsItsMetadata) {
  REQUIRE_SMOLLM2();
  const auto config = models::gguf_hf_config(formats::GgufFile::open(kSmolLm2Path));
  const nlohmann::json expected = {{"model_type", "llama"},
                                   {"architectures", {"LlamaForCausalLM"}},
                                   {"vocab_size", 49152},
                                   {"hidden_size", 576},
                                   {"intermediate_size", 1536},
                                   {"num_hidden_layers", 30},
                                   {"num_attention_heads", 9},
                                   {"num_key_value_heads", 3},
                                   {"head_dim", 64},
                                   {"hidden_act", "silu"},
                                   {"max_position_embeddings", 8192},
                                   {"rms_norm_eps", static_cast<double>(1e-5f)},
                                   {"rope_theta", 100000.0},
                                   {"tie_word_embeddings", true},
                                   {"bos_token_id", 1},
                                   {"eos_token_id", 2},
                                   {"pad_token_id", 2}};
  EXPECT_EQ(config, expected) << config.dump();
}

TEST(GgufCheckpoint, GenerateContinuesAsTransformersGreedily) {
  REQUIRE_SMOLLM2();
  ASSERT_EQ(smollm2().error, "");
  const auto greedy = nlohmann::json::parse(read_bytes(smollm2().dir + "/greedy.json"));
  const std::string prompt = greedy["prompt"];
  ASSERT_EQ(prompt, "The film was a delight from start to finish, and the acting");
  const auto ids = greedy["ids"].get<std::vector<int64_t>>();
  ASSERT_EQ(ids.size(), 8u);
  const auto r = gradaccum::testing::run_cli(std::string("generate --checkpoint ") + kSmolLm2Path + " --prompt '" +
                                             prompt + "' --temperature 0 --max-new-tokens 8 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, prompt + greedy["text"].get<std::string>() + "\n");
  EXPECT_EQ(greedy["text"], " was outstanding. I think I may have");
}

// --- Refused files ---------------------------------------------------------------------

// Loading the synthetic file `name` as a causal LM: its path, and the one-line error it gives.
std::pair<std::string, std::string> refusal_of(const std::string& name) {
  const auto path = synthetic().dir + "/" + name;
  return {path, error_of([&] { models::load_language_model(path, -1, 0); })};
}

TEST(GgufCheckpointErrors, AnotherArchitectureIsNamed) {
  ASSERT_EQ(synthetic().error, "");
  const auto [path, error] = refusal_of("bad-architecture.gguf");
  EXPECT_EQ(error, path +
                       ": general.architecture is \"gpt2\"; gradaccum reads GGUF checkpoints of architecture \"llama\" "
                       "only");
  const auto r = gradaccum::testing::run_cli("eval --checkpoint " + path + " /dev/null");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "gradaccum: error: " + path +
                       ": general.architecture is \"gpt2\"; gradaccum reads GGUF checkpoints of architecture "
                       "\"llama\" only\n");
}

TEST(GgufCheckpointErrors, AYarnKeyThatIsNotReadIsNamed) {
  ASSERT_EQ(synthetic().error, "");
  const auto [path, error] = refusal_of("bad-rope-yarn-log-multiplier.gguf");
  EXPECT_EQ(error, path +
                       ": metadata key llama.rope.scaling.yarn_log_multiplier is not supported (gradaccum reads YaRN's "
                       "factor, original_context_length, yarn_beta_fast and yarn_beta_slow)");
}

TEST(GgufCheckpointErrors, AMissingKeyIsNamed) {
  ASSERT_EQ(synthetic().error, "");
  const auto [path, error] = refusal_of("bad-missing-key.gguf");
  EXPECT_EQ(error, path + ": metadata key llama.embedding_length is absent");
}

TEST(GgufCheckpointErrors, ATensorOfTheWrongShapeIsNamed) {
  ASSERT_EQ(synthetic().error, "");
  const auto [path, error] = refusal_of("bad-shape.gguf");
  EXPECT_EQ(error,
            path +
                ": tensor blk.1.attn_k.weight has shape [16, 31], not [16, 32] (llama.attention.head_count_kv × head "
                "size, llama.embedding_length)");
  const auto r = gradaccum::testing::run_cli("generate --checkpoint " + path + " --prompt the");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
}

}  // namespace gguf_checkpoint_test
