// A GGUF file through the program (a tiny Llama that gguf's GGUFWriter wrote,
// tests/hf/gguf_transformers_reference.py): `train` starts from it as model.hf_checkpoint, as a
// causal LM and as a classifier with a fresh score head, with its own tokenizer; final/ holds
// an HF checkpoint that transformers' from_pretrained loads with every key matched and the same
// float64 logits (tests/hf/check_from_pretrained.py), and a tokenizer.json that tokenizers loads
// with the GGUF tokenizer's ids; `tokenize --tokenizer FILE.gguf` uses the file's tokenizer; a
// model.type naming another architecture is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "gguf_reference.h"
#include "gradaccum/core/batch.h"
#include "gradaccum/data/tokenizer.h"
#include "gradaccum/formats/safetensors.h"
#include "gradaccum/models/built_model.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/models/sequence_classifier.h"
#include "test_support.h"

namespace gguf_cli_test {

namespace fs = std::filesystem;
using namespace gradaccum;
using gradaccum::testing::make_temp_dir;
using gradaccum::testing::run_cli;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string python() { return "'" + gradaccum::testing::venv_program("python") + "' -B "; }

// The tiny Llama (~10 s of Python), once per build tree (shared with gguf_checkpoint_test.cpp);
// `error` says why it is missing.
struct Synthetic {
  std::string dir, error;
  std::string gguf() const { return dir + "/tiny-llama.gguf"; }
};
const Synthetic& synthetic() {
  static const Synthetic s = [] {
    const auto made = gradaccum::testing::run_gguf_reference("gguf-models", "models");
    return Synthetic{made.dir, made.error};
  }();
  return s;
}

const std::string kRun =
    " --set data.max_length=16 --set data.eval_limit=-1 --set per_device_train_batch_size=4 "
    "--set gradient_accumulation_steps=2 --set max_steps=2 --set threads=2 --set learning_rate=1e-3 --set seed=3";

// A right-padded batch of `texts` (pad id 0, which no text holds) under `tokenizer`.
std::pair<torch::Tensor, torch::Tensor> padded_batch(const data::Tokenizer& tokenizer,
                                                     const std::vector<std::string>& texts) {
  std::vector<std::vector<data::TokenId>> rows;
  size_t longest = 0;
  for (const auto& t : texts) {
    rows.push_back(tokenizer.encode(t));
    longest = std::max(longest, rows.back().size());
  }
  auto ids = torch::zeros({static_cast<int64_t>(rows.size()), static_cast<int64_t>(longest)}, torch::kLong);
  auto mask = torch::zeros_like(ids);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t c = 0; c < rows[r].size(); ++c) {
      ids[static_cast<int64_t>(r)][static_cast<int64_t>(c)] = rows[r][c];
      mask[static_cast<int64_t>(r)][static_cast<int64_t>(c)] = 1;
    }
  }
  return {ids, mask};
}

// gradaccum's float64 logits of the checkpoint in `dir` on the batch, written beside it as
// check_from_pretrained.py reads them (reference.safetensors).
void write_reference(const std::string& dir, const data::Tokenizer& tokenizer, int64_t labels) {
  auto model = models::load_language_model(dir, -1, 0);
  ASSERT_EQ(model.num_labels, labels);
  const auto [ids, mask] = padded_batch(tokenizer, {"the film and the light", "God said ab", "the"});
  auto& module = model.task->module();
  module.to(torch::kDouble);
  module.eval();
  torch::NoGradGuard no_grad;
  torch::Tensor logits, targets;
  if (auto* lm = dynamic_cast<models::CausalLmHeadImpl*>(&module)) {
    logits = lm->forward(ids, mask);
    targets = ids.masked_fill(mask == 0, core::kIgnoreIndex);
  } else {
    auto* classifier = dynamic_cast<models::SequenceClassificationModelImpl*>(&module);
    ASSERT_NE(classifier, nullptr);
    logits = classifier->forward(ids, mask);
    targets = torch::tensor({0, 1, 0}, torch::kLong);
  }
  formats::save_safetensors(dir + "/reference.safetensors", {{"input_ids", ids},
                                                             {"attention_mask", mask},
                                                             {"position_ids", models::gpt2_position_ids(mask)},
                                                             {"labels", targets},
                                                             {"logits64", logits.contiguous()}});
}

TEST(GgufCli, TrainsFromAGgufFileAndFinalLoadsWithFromPretrained) {
  ASSERT_EQ(synthetic().error, "");
  const auto dir = make_temp_dir("gguf-train");
  const auto gguf = synthetic().gguf();
  // A causal LM on KJV verses, and a classifier on labelled lines, both with the file's tokenizer.
  const auto lm_steps = gradaccum::testing::train_steps(
      "--set model.hf_checkpoint=" + gguf + " --set data.type=kjv --set data.train_limit=32" + kRun, dir + "/lm");
  {
    std::ofstream labelled(dir + "/labelled.jsonl");
    for (int i = 0; i < 16; ++i) {
      labelled << nlohmann::json{{"text", i % 2 ? "the film and the light" : "God said ab"}, {"label", i % 2}}.dump()
               << "\n";
    }
  }
  const auto cls_steps = gradaccum::testing::train_steps(
      "--set model.hf_checkpoint=" + gguf + " --set data.type=text --set data.path=" + dir + "/labelled.jsonl" + kRun,
      dir + "/cls");
  ASSERT_EQ(lm_steps.size(), 2u);
  ASSERT_EQ(cls_steps.size(), 2u);
  EXPECT_GT(lm_steps.front()["loss"].get<double>(), 1.0);
  // Two classes start near log 2 from a fresh head.
  EXPECT_NEAR(cls_steps.front()["loss"].get<double>(), std::log(2.0), 0.5);

  const auto tokenizer = data::Tokenizer::load(gguf);
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& [name, labels, model_class] : std::vector<std::tuple<std::string, int64_t, std::string>>{
           {"lm/final", 0, "LlamaForCausalLM"}, {"cls/final", 2, "LlamaForSequenceClassification"}}) {
    SCOPED_TRACE(name);
    const auto final_dir = dir + "/" + name;
    const auto config = nlohmann::json::parse(read_bytes(final_dir + "/config.json"));
    EXPECT_EQ(config["architectures"][0], model_class);
    EXPECT_EQ(config["model_type"], "llama");
    EXPECT_EQ(config["num_key_value_heads"], 2);
    EXPECT_EQ(config["tie_word_embeddings"], false);
    // The GGUF's tokenizer beside the model, as a tokenizer.json; no copy of the GGUF file.
    ASSERT_TRUE(fs::exists(final_dir + "/tokenizer.json"));
    EXPECT_FALSE(fs::exists(final_dir + "/tiny-llama.gguf"));
    const auto written = data::Tokenizer::load(final_dir);
    EXPECT_EQ(written.encode("<|im_start|>the film<think>1999"), tokenizer.encode("<|im_start|>the film<think>1999"));
    write_reference(final_dir, tokenizer, labels);
    cases.push_back({{"name", name}, {"labels", labels}});
  }
  std::ofstream(dir + "/cases.json") << cases.dump();
  const std::string script = std::string(GRADACCUM_TEST_DATA) + "/../hf/check_from_pretrained.py";
  ASSERT_EQ(std::system((python() + "'" + script + "' '" + dir + "' > '" + dir + "/log' 2>&1").c_str()), 0)
      << read_bytes(dir + "/log");
  const auto results = nlohmann::json::parse(read_bytes(dir + "/results.json"));
  for (const auto& c : cases) {
    const auto& r = results.at(c["name"].get<std::string>());
    EXPECT_TRUE(r["missing"].empty()) << r.dump();
    EXPECT_TRUE(r["unexpected"].empty()) << r.dump();
    EXPECT_TRUE(r["mismatched"].empty()) << r.dump();
    EXPECT_LE(r["max_relative_difference"].get<double>(), 1e-12) << r.dump();
    EXPECT_GT(r["max_abs_logit"].get<double>(), 0.1) << r.dump();
  }

  // tokenizers reads final/tokenizer.json with the GGUF tokenizer's ids.
  const auto corpus = std::string(GRADACCUM_TEST_DATA) + "/tokenizer/corpus.txt";
  const auto encode = std::string(GRADACCUM_TEST_DATA) + "/tokenizer/hf_reference_encode.py";
  ASSERT_EQ(std::system((python() + "'" + encode + "' '" + dir + "/lm/final/tokenizer.json' '" + corpus + "' > '" +
                         dir + "/ids' 2> '" + dir + "/log'")
                            .c_str()),
            0)
      << read_bytes(dir + "/log");
  const auto text = read_bytes(corpus), ids = read_bytes(dir + "/ids");
  size_t lines = 0, mismatches = 0;
  for (size_t at = 0, id_at = 0; at < text.size() && id_at < ids.size(); ++lines) {
    const auto end = text.find('\n', at), id_end = ids.find('\n', id_at);
    const auto expected = nlohmann::json::parse(ids.substr(id_at, id_end - id_at)).get<std::vector<data::TokenId>>();
    if (tokenizer.encode(text.substr(at, end - at)) != expected) ++mismatches;
    at = end + 1, id_at = id_end + 1;
  }
  EXPECT_EQ(lines, 472u);
  EXPECT_EQ(mismatches, 0u);
}

TEST(GgufCli, TokenizeUsesTheFilesTokenizer) {
  ASSERT_EQ(synthetic().error, "");
  const auto dir = make_temp_dir("gguf-tokenize");
  std::ofstream(dir + "/in.txt") << "<|im_start|>the film 1999\n";
  const auto r = run_cli("tokenize --tokenizer " + synthetic().gguf() + " " + dir + "/in.txt");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ids = data::Tokenizer::load(synthetic().gguf()).encode("<|im_start|>the film 1999");
  EXPECT_EQ(r.out, nlohmann::json(ids).dump() + "\n");
  EXPECT_EQ(ids.front(), 1);  // <|im_start|>, a control token, whole
}

// LoRA on a GGUF base: the adapter names the file as its base; `eval` and `generate` read the base
// from there or from --base FILE.gguf (the adapter moved, its recorded base gone), and `export
// --merge-lora --base FILE.gguf` writes an HF checkpoint with the adapted model's loss and output.
TEST(GgufCli, AdaptersOnAGgufBaseLoadWithBaseFileAndMergeIntoAnHfCheckpoint) {
  ASSERT_EQ(synthetic().error, "");
  const auto dir = make_temp_dir("gguf-lora");
  const auto gguf = synthetic().gguf();
  const auto steps = gradaccum::testing::train_steps(
      "--set model.hf_checkpoint=" + gguf +
          " --set data.type=kjv --set data.train_limit=32 --set lora.target_modules=[q_proj,v_proj,down_proj]"
          " --set lora.r=2 --set lora.alpha=4 --set learning_rate=3e-2" +
          kRun,
      dir + "/run");
  ASSERT_EQ(steps.size(), 2u);
  const auto adapter = dir + "/run/final";
  const auto config = nlohmann::json::parse(read_bytes(adapter + "/adapter_config.json"));
  EXPECT_EQ(config["base_model_name_or_path"], fs::absolute(gguf).lexically_normal().string());
  EXPECT_EQ(config["target_modules"], nlohmann::json({"q_proj", "v_proj", "down_proj"}));
  EXPECT_EQ(formats::load_safetensors(adapter + "/adapter_model.safetensors").size(), 2u * 3u * 2u);

  std::ofstream(dir + "/texts.txt") << "the film and the light\nGod said ab <think>\n";
  const auto loss_of = [&](const std::string& args) {
    const auto r = run_cli("eval " + args + " " + dir + "/texts.txt --threads 2");
    EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out)["loss"].get<double>() : -1.0;
  };
  const double adapted = loss_of("--checkpoint " + adapter);
  const double base = loss_of("--checkpoint " + gguf);
  EXPECT_GT(gradaccum::testing::relative_difference(adapted, base), 1e-4) << "the adapter changes nothing";

  // Moved away from a base that is no longer where it says: --base names the file.
  const auto moved = dir + "/moved";
  fs::create_directories(moved);
  for (const char* name : {"adapter_model.safetensors", "tokenizer.json"}) {
    if (fs::exists(adapter + "/" + name)) fs::copy_file(adapter + "/" + name, moved + "/" + name);
  }
  auto elsewhere = config;
  elsewhere["base_model_name_or_path"] = dir + "/no-such-base.gguf";
  std::ofstream(moved + "/adapter_config.json") << elsewhere.dump();
  const auto missing = run_cli("eval --checkpoint " + moved + " " + dir + "/texts.txt");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(std::count(missing.err.begin(), missing.err.end(), '\n'), 1) << missing.err;
  EXPECT_NE(missing.err.find(dir + "/no-such-base.gguf"), std::string::npos) << missing.err;
  EXPECT_EQ(loss_of("--checkpoint " + moved + " --base " + gguf), adapted);

  // generate through the adapter equals generate through the merged checkpoint.
  const auto merged = run_cli("export --merge-lora " + moved + " " + dir + "/merged --base " + gguf);
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  EXPECT_EQ(nlohmann::json::parse(read_bytes(dir + "/merged/config.json"))["model_type"], "llama");
  EXPECT_LE(gradaccum::testing::relative_difference(loss_of("--checkpoint " + dir + "/merged"), adapted), 1e-5);
  const std::string prompt = " --prompt 'the film' --temperature 0 --max-new-tokens 6 --threads 2";
  const auto through_adapter = run_cli("generate --checkpoint " + moved + " --base " + gguf + prompt);
  const auto through_merged = run_cli("generate --checkpoint " + dir + "/merged" + prompt);
  ASSERT_EQ(through_adapter.exit_code, 0) << through_adapter.err;
  ASSERT_EQ(through_merged.exit_code, 0) << through_merged.err;
  EXPECT_EQ(through_adapter.out, through_merged.out);
  EXPECT_GT(through_adapter.out.size(), std::string("the film\n").size());
}

TEST(GgufCli, AContradictingModelTypeIsRefused) {
  ASSERT_EQ(synthetic().error, "");
  const auto r = run_cli("train --set model.type=gpt2 --set model.hf_checkpoint=" + synthetic().gguf() +
                         " --set data.type=kjv --set data.train_limit=8 --set max_steps=1 --set output_dir=" +
                         make_temp_dir("gguf-type") + "/run");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "gradaccum: error: key 'model.type': gpt2 contradicts model.hf_checkpoint " + synthetic().gguf() +
                       ", a llama checkpoint (leave model.type out: the checkpoint's is used)\n");
}

}  // namespace gguf_cli_test
