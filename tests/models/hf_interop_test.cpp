// Hugging Face transformers itself as the reference. (1) Models of every architecture
// (GPT-2, BLOOM, Llama, Qwen2, Qwen3, Mistral), causal LM and sequence classifier, in
// shapes other than the defaults, saved by transformers' save_pretrained
// (tests/hf/save_pretrained_models.py, run with the venv's Python when this suite starts)
// load into gradaccum's models (model.hf_checkpoint's loader, one or several shards) and
// give transformers' logits on a left- and right-padded batch: ≤ 1e-12 relative in float64,
// ≤ 1e-5 in float32; and checkpoints that gradaccum writes load with transformers'
// from_pretrained, all keys matched, with the same float64 logits. (transformers' BLOOM
// runs its attention softmax in float32 whatever the dtype, its Llama family its norms,
// RoPE and softmax; the float64 reference runs them in float64, see the script.) Tied and
// untied LM heads; RoPE's inverse frequencies for every scaling HF names equal
// transformers'; a GPT-2 that scales attention by the layer index, which HF allows and
// gradaccum does not, is refused with a one-line error.
// (2) Trajectories: `gradaccum train` equals transformers' Trainer step for step from the
// same initial weights on the same padded batches, and its naive mode equals HF Accelerate's
// accumulate() loop (tests/hf/trainer_parity.py says how the peers run); with LoRA adapters it
// equals the Trainer on a PEFT model (tests/hf/peft_trainer_parity.py). (3) `gradaccum eval`
// gives transformers' perplexity on a checkpoint gradaccum wrote.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gradaccum/formats/safetensors.h"
#include "gradaccum/models/bloom.h"
#include "gradaccum/models/built_model.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/models/hf_checkpoint.h"
#include "gradaccum/models/rope.h"
#include "gradaccum/models/sequence_classifier.h"
#include "test_support.h"

namespace hf_interop_test {

namespace fs = std::filesystem;
using namespace gradaccum;
using gradaccum::testing::max_relative_difference;

// Runs tests/hf/<script> DIR [ARG] with the venv's Python, its output into DIR/log; the exit status.
int run_hf_script(const std::string& script, const std::string& dir, const std::string& arg = "") {
  const std::string path = std::string(GRADACCUM_TEST_DATA) + "/../hf/" + script;
  const std::string command = "'" + gradaccum::testing::venv_program("python") + "' -B '" + path + "' '" + dir + "'" +
                              (arg.empty() ? "" : " '" + arg + "'") + " > '" + dir + "/log' 2>&1";
  return std::system(command.c_str());
}

// tests/hf/<script> DIR [ARG] run once per build tree (shared_reference), for the suites that only
// read what it wrote; keyed by the bytes of every script there (they import one another) and of
// the tokenizer's tiktoken helper.
gradaccum::testing::SharedReference shared_hf_script(const std::string& script, const std::string& arg = "") {
  const std::string hf = std::string(GRADACCUM_TEST_DATA) + "/../hf/";
  std::vector<std::string> inputs = {std::string(GRADACCUM_TEST_DATA) + "/tokenizer/gpt2_reference.py"};
  for (const auto& entry : fs::directory_iterator(hf)) {
    if (entry.path().extension() == ".py") inputs.push_back(entry.path().string());
  }
  std::sort(inputs.begin(), inputs.end());
  return gradaccum::testing::shared_reference(script, inputs, [&](const std::string& dir) {
    return "'" + gradaccum::testing::venv_program("python") + "' -B '" + hf + script + "' '" + dir + "'" +
           (arg.empty() ? "" : " '" + arg + "'");
  });
}

// The last lines of a log, for a failure message (the suite's directory is removed after it).
std::string tail_of(const std::string& path) {
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.size() > 2000 ? text.substr(text.size() - 2000) : text;
}

class HfInterop : public ::testing::Test {
 protected:
  // transformers writes the checkpoints once for the build tree (~10 s).
  static void SetUpTestSuite() {
    const auto made = shared_hf_script("save_pretrained_models.py");
    dir_ = made.dir;
    error_ = made.error;
  }

  void SetUp() override {
    ASSERT_EQ(error_, "") << "tests/hf/save_pretrained_models.py (transformers in the venv "
                          << gradaccum::testing::venv_program("python") << "?)";
  }

  static nlohmann::json cases() {
    std::ifstream in(dir_ + "/cases.json");
    return nlohmann::json::parse(in);
  }

  static std::string dir_, error_;
};
std::string HfInterop::dir_, HfInterop::error_;

// gradaccum's model for a config.json with `labels` (0 = causal LM), through the architecture table.
models::BuiltModel build(const nlohmann::json& config, int64_t labels, const std::string& what) {
  return models::language_model_from_hf_config(config, what, labels, 0);
}

// The tensor named `key` of a safetensors file's content (an ADD_FAILURE naming `what` when absent).
torch::Tensor named(const std::vector<std::pair<std::string, torch::Tensor>>& tensors, const std::string& key,
                    const std::string& what) {
  for (const auto& [k, t] : tensors) {
    if (k == key) return t;
  }
  ADD_FAILURE() << what << ": no " << key;
  return torch::Tensor();
}

torch::Tensor forward(torch::nn::Module& module, const torch::Tensor& ids, const torch::Tensor& mask) {
  torch::NoGradGuard no_grad;
  if (auto* lm = dynamic_cast<models::CausalLmHeadImpl*>(&module)) return lm->forward(ids, mask);
  auto* classifier = dynamic_cast<models::SequenceClassificationModelImpl*>(&module);
  EXPECT_NE(classifier, nullptr);
  return classifier->forward(ids, mask);
}

TEST_F(HfInterop, SavePretrainedModelsLoadAndGiveTransformersLogits) {
  int compared = 0;
  for (const auto& c : cases()) {
    if (c.contains("refused")) continue;
    const std::string name = c["name"], architecture = c["architecture"];
    const int64_t labels = c["labels"];
    const std::string case_dir = dir_ + "/" + name;
    const auto checkpoint = models::read_hf_checkpoint(case_dir);
    EXPECT_EQ(models::hf_model_type(checkpoint.config, name), architecture);
    EXPECT_EQ(models::hf_num_labels(checkpoint.config, name), labels == 0 ? 0 : labels) << name;
    const auto reference = formats::load_safetensors(case_dir + "/reference.safetensors");
    auto tensor = [&](const std::string& key) { return named(reference, key, name); };
    const auto ids = tensor("input_ids"), mask = tensor("attention_mask");
    // Positions where both implementations define the logits: the real tokens (a padding
    // query that sees no real key is handled differently by HF and gradaccum).
    const auto real = labels == 0 ? mask.to(torch::kBool) : torch::ones({ids.size(0)}, torch::kBool);
    for (const auto dtype : {torch::kDouble, torch::kFloat}) {
      auto built = build(checkpoint.config, labels, name);
      EXPECT_EQ(built.architecture, architecture);
      auto& model = built.task->module();
      model.to(dtype);
      built.load_weights(checkpoint.tensors, name);
      const auto logits = forward(model, ids, mask);
      const auto expected = tensor(dtype == torch::kDouble ? "logits64" : "logits32");
      ASSERT_EQ(logits.sizes(), expected.sizes()) << name;
      EXPECT_TRUE(torch::isfinite(logits.index({real})).all().item<bool>()) << name;
      EXPECT_TRUE(torch::isfinite(expected.index({real})).all().item<bool>()) << name;
      const double difference =
          max_relative_difference(logits.to(torch::kDouble).index({real}), expected.to(torch::kDouble).index({real}));
      EXPECT_LE(difference, dtype == torch::kDouble ? 1e-12 : 1e-5)
          << name << " in " << (dtype == torch::kDouble ? "float64" : "float32");
      EXPECT_GT(expected.index({real}).abs().max().item<double>(), 0.1) << name;  // of substance
      ++compared;
    }
  }
  EXPECT_EQ(compared, 2 * 18);
}

// RoPE's inverse frequencies and cos/sin scaling for every scaling type transformers names
// (default, linear, dynamic within and beyond max_position_embeddings, llama3, yarn with and
// without mscale) equal transformers' own, computed in float64, to 1e-13 relative; yarn's to
// 1e-8, as transformers computes its ramp between the corrected dimensions in float32 (its
// linear_ramp_factor names torch.float32), the rest in float64.
TEST_F(HfInterop, RopeFrequenciesOfEveryScalingEqualTransformers) {
  std::ifstream in(dir_ + "/rope.json");
  const auto cases = nlohmann::json::parse(in);
  const auto reference = formats::load_safetensors(dir_ + "/rope.safetensors");
  ASSERT_EQ(cases.size(), 7u);
  for (const auto& c : cases) {
    const std::string name = c["name"];
    const auto& p = c["rope_parameters"];
    models::RopeOptions rope;
    rope.type = models::parse_rope_type(p["rope_type"], name);
    rope.theta = p["rope_theta"];
    rope.factor = p.value("factor", 1.0);
    rope.low_freq_factor = p.value("low_freq_factor", 1.0);
    rope.high_freq_factor = p.value("high_freq_factor", 4.0);
    rope.original_max_position_embeddings = p.value("original_max_position_embeddings", 0);
    if (p.contains("mscale")) rope.mscale = p["mscale"].get<double>();
    if (p.contains("mscale_all_dim")) rope.mscale_all_dim = p["mscale_all_dim"].get<double>();
    if (p.contains("beta_fast")) rope.beta_fast = p["beta_fast"].get<double>();
    if (p.contains("beta_slow")) rope.beta_slow = p["beta_slow"].get<double>();
    rope.truncate = p.value("truncate", true);
    const auto ours = models::rope_frequencies(rope, c["head_dim"], c["max_position_embeddings"], c["seq_len"]);
    const auto theirs = named(reference, name, name);
    ASSERT_EQ(ours.inv_freq.sizes(), theirs.sizes()) << name;
    EXPECT_LE(max_relative_difference(ours.inv_freq, theirs), name.rfind("yarn", 0) == 0 ? 1e-8 : 1e-13) << name;
    EXPECT_NEAR(ours.attention_scaling, c["attention_scaling"].get<double>(), 1e-15) << name;
  }
  // Of substance: the scalings differ from the default, and dynamic scaling only beyond the context.
  auto frequencies = [&](const std::string& key) { return named(reference, key, key); };
  EXPECT_TRUE(torch::equal(frequencies("dynamic-within"), frequencies("default")));
  EXPECT_GT(max_relative_difference(frequencies("dynamic-beyond"), frequencies("default")), 0.01);
  EXPECT_GT(max_relative_difference(frequencies("linear"), frequencies("default")), 0.1);
}

TEST_F(HfInterop, AGpt2ThatScalesAttentionByLayerIsRefusedWithTheKeyNamed) {
  int refused = 0;
  for (const auto& c : cases()) {
    if (!c.contains("refused")) continue;
    const std::string name = c["name"], expected = c["refused"];
    const auto checkpoint = models::read_hf_checkpoint(dir_ + "/" + name);
    EXPECT_ONE_LINE_ERROR(build(checkpoint.config, c["labels"], name), expected);
    ++refused;
  }
  EXPECT_EQ(refused, 1);
}

// The other direction: what gradaccum writes (write_hf_checkpoint, as a run's final/ does)
// loads with transformers' AutoModelFor*.from_pretrained with no missing, unexpected or
// mismatched key, and transformers' float64 logits and loss on a padded batch equal
// gradaccum's (to 1e-12; the causal-LM loss to 1e-6, see below).
TEST_F(HfInterop, GradaccumCheckpointsLoadWithFromPretrainedAndGiveTheSameLogits) {
  const std::string root = gradaccum::testing::make_temp_dir("hf-interop-ours");
  struct Case {
    std::string name, architecture;
    int64_t labels;
    nlohmann::json config;  // the Llama family's config.json (gpt2 and bloom: from their configs)
  };
  // The Llama family: grouped-query attention, llama3 RoPE scaling and an untied head; a Qwen2
  // classifier with a sliding window on its second layer; Qwen3 with an explicit head_dim; Mistral
  // with multi-query attention and a window shorter than the batch's rows.
  const nlohmann::json llama = {{"model_type", "llama"},
                                {"vocab_size", 60},
                                {"hidden_size", 32},
                                {"intermediate_size", 40},
                                {"num_hidden_layers", 2},
                                {"num_attention_heads", 4},
                                {"num_key_value_heads", 2},
                                {"max_position_embeddings", 32},
                                {"rms_norm_eps", 1e-5},
                                {"attention_bias", true},
                                {"rope_theta", 1000.0},
                                {"rope_scaling",
                                 {{"rope_type", "llama3"},
                                  {"factor", 4.0},
                                  {"low_freq_factor", 1.0},
                                  {"high_freq_factor", 4.0},
                                  {"original_max_position_embeddings", 8}}}};
  const nlohmann::json qwen2 = {{"model_type", "qwen2"},      {"vocab_size", 52},
                                {"hidden_size", 24},          {"intermediate_size", 32},
                                {"num_hidden_layers", 2},     {"num_attention_heads", 6},
                                {"num_key_value_heads", 3},   {"max_position_embeddings", 32},
                                {"use_sliding_window", true}, {"sliding_window", 3},
                                {"max_window_layers", 1},     {"tie_word_embeddings", true}};
  const nlohmann::json qwen3 = {{"model_type", "qwen3"},    {"vocab_size", 55},       {"hidden_size", 32},
                                {"intermediate_size", 36},  {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                                {"num_key_value_heads", 2}, {"head_dim", 6},          {"max_position_embeddings", 32},
                                {"rms_norm_eps", 1e-5}};
  const nlohmann::json mistral = {{"model_type", "mistral"},  {"vocab_size", 51},
                                  {"hidden_size", 32},        {"intermediate_size", 24},
                                  {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                                  {"num_key_value_heads", 1}, {"max_position_embeddings", 32},
                                  {"sliding_window", 4}};
  const std::vector<Case> made = {
      {"gpt2-lm", "gpt2", 0, {}},       {"gpt2-cls", "gpt2", 4, {}},       {"bloom-lm", "bloom", 0, {}},
      {"bloom-cls", "bloom", 3, {}},    {"gpt2-lm-untied", "gpt2", 0, {}}, {"llama-lm", "llama", 0, llama},
      {"qwen2-cls", "qwen2", 2, qwen2}, {"qwen3-lm", "qwen3", 0, qwen3},   {"mistral-lm", "mistral", 0, mistral}};
  nlohmann::json listed = nlohmann::json::array();
  std::map<std::string, double> losses;
  for (size_t i = 0; i < made.size(); ++i) {
    const auto& c = made[i];
    nlohmann::json config = c.config;
    if (c.architecture == "gpt2") {
      models::Gpt2Config g;
      g.vocab_size = 57, g.n_positions = 24, g.n_embd = 30, g.n_layer = 3, g.n_head = 5;
      g.tie_word_embeddings = c.name.find("untied") == std::string::npos;
      config = models::gpt2_hf_config(g);
    } else if (c.architecture == "bloom") {
      models::BloomConfig b;
      b.vocab_size = 53, b.hidden_size = 24, b.n_layer = 2, b.n_head = 4;
      config = models::bloom_hf_config(b);
    }
    auto built = models::language_model_from_hf_config(config, c.name, c.labels, 7 + i);
    auto* model = &built.task->module();
    {
      // Every weight redrawn: norm gains and biases start at 1 and 0, which would hide a
      // swapped or transposed tensor.
      torch::NoGradGuard no_grad;
      torch::manual_seed(static_cast<uint64_t>(40 + i));
      for (const auto& item : model->named_parameters()) {
        auto p = item.value();
        const bool gain =
            (item.key().find("ln") != std::string::npos || item.key().find("norm") != std::string::npos) &&
            item.key().ends_with("weight");
        p.copy_(gain ? 1.0 + 0.2 * torch::randn_like(p) : 0.3 * torch::randn_like(p));
      }
    }
    // What gradaccum writes: its own config.json for the architecture and task.
    config = built.hf_config;
    // A classifier's final/ names the pad id its data pads with (cli/workload.cpp): HF finds
    // the pooled token from it, gradaccum from the mask. Here the batch pads with 0.
    if (c.labels > 0) config["pad_token_id"] = 0;
    const std::string case_dir = root + "/" + c.name;
    models::write_hf_checkpoint(case_dir, {config, built.weights()});
    // A padded batch: row 0 unpadded, row 1 right-padded, row 2 left-padded (pad id 0,
    // real ids ≥ 4).
    auto ids = torch::randint(4, 50, {3, 9}, torch::kLong);
    auto mask = torch::ones({3, 9}, torch::kLong);
    mask[1].slice(0, 6, 9).zero_();
    mask[2].slice(0, 0, 2).zero_();
    ids.masked_fill_(mask == 0, 0);
    const auto positions = models::gpt2_position_ids(mask);
    model->to(torch::kDouble);
    const auto logits = forward(*model, ids, mask);
    // Labels: the ids with padding ignored (causal LM), or a class per row; gradaccum's loss is
    // the sum over what is scored divided by its count.
    torch::Tensor labels;
    double loss = 0.0;
    if (c.labels == 0) {
      labels = ids.masked_fill(mask == 0, core::kIgnoreIndex);
      const auto sum = models::causal_lm_loss(logits, labels);
      loss = (sum.sum / sum.count.to(torch::kDouble)).item<double>();
    } else {
      labels = torch::randint(c.labels, {3}, torch::kLong);
      loss = torch::nn::functional::cross_entropy(logits, labels).item<double>();
    }
    losses[c.name] = loss;
    formats::save_safetensors(case_dir + "/reference.safetensors", {{"input_ids", ids},
                                                                    {"attention_mask", mask},
                                                                    {"position_ids", positions},
                                                                    {"labels", labels},
                                                                    {"logits64", logits.contiguous()}});
    listed.push_back({{"name", c.name}, {"labels", c.labels}});
  }
  std::ofstream(root + "/cases.json") << listed.dump();
  const int status = run_hf_script("check_from_pretrained.py", root);
  ASSERT_EQ(status, 0) << "tests/hf/check_from_pretrained.py failed:\n" << tail_of(root + "/log");
  std::ifstream in(root + "/results.json");
  const auto results = nlohmann::json::parse(in);
  ASSERT_EQ(results.size(), made.size());
  const std::map<std::string, std::string> classes = {{"gpt2-lm", "GPT2LMHeadModel"},
                                                      {"gpt2-cls", "GPT2ForSequenceClassification"},
                                                      {"bloom-lm", "BloomForCausalLM"},
                                                      {"bloom-cls", "BloomForSequenceClassification"},
                                                      {"gpt2-lm-untied", "GPT2LMHeadModel"},
                                                      {"llama-lm", "LlamaForCausalLM"},
                                                      {"qwen2-cls", "Qwen2ForSequenceClassification"},
                                                      {"qwen3-lm", "Qwen3ForCausalLM"},
                                                      {"mistral-lm", "MistralForCausalLM"}};
  for (const auto& c : made) {
    const auto& r = results.at(c.name);
    EXPECT_EQ(r["model_class"], classes.at(c.name));
    EXPECT_TRUE(r["missing"].empty()) << c.name << ": " << r["missing"].dump();
    EXPECT_TRUE(r["unexpected"].empty()) << c.name << ": " << r["unexpected"].dump();
    EXPECT_TRUE(r["mismatched"].empty()) << c.name << ": " << r["mismatched"].dump();
    EXPECT_LE(r["max_relative_difference"].get<double>(), 1e-12) << c.name;
    EXPECT_GT(r["max_abs_logit"].get<double>(), 0.1) << c.name;
    // The same loss on the padded batch (HF: mean over labels != -100, or over rows).
    // transformers' causal-LM loss casts the logits to float32 first (loss_utils.py,
    // logits.float()), even for a float64 model: float32 accuracy there, float64 for the
    // classifier's.
    const double tolerance = c.labels == 0 ? 1e-6 : 1e-12;
    EXPECT_NEAR(r["loss"].get<double>(), losses.at(c.name), tolerance * losses.at(c.name)) << c.name;
    EXPECT_GT(losses.at(c.name), 0.1) << c.name;
  }
}

// (2) The peers' trajectories, written once (~30 s of Python), feed one test.
class HfTrainerParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = gradaccum::testing::make_temp_dir("hf-trainer-parity");
    tokenizer_ = gradaccum::testing::gpt2_tokenizer_dir();
    status_ = run_hf_script("trainer_parity.py", dir_, tokenizer_ + "/gpt2.tiktoken");
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  void SetUp() override {
    ASSERT_EQ(status_, 0) << "tests/hf/trainer_parity.py failed (transformers, accelerate and tiktoken in the "
                          << "venv, gpt2.tiktoken in " << tokenizer_ << "?):\n"
                          << tail_of(dir_ + "/log");
  }

  static std::vector<nlohmann::json> peer(const std::string& name) {
    std::ifstream in(dir_ + "/" + name + ".json");
    return nlohmann::json::parse(in).get<std::vector<nlohmann::json>>();
  }

  // `gradaccum train` with the peers' settings (trainer_parity.py's constants) on their data
  // file, in its order, from their initial weights.
  static std::vector<nlohmann::json> train(const std::string& dtype, const std::string& normalization) {
    const std::string args =
        "--set model.hf_checkpoint=" + dir_ + "/model --set data.type=text --set data.path=" + dir_ +
        "/train.jsonl --set data.tokenizer=" + tokenizer_ +
        " --set data.max_length=48 --set data.eval_fraction=0 --set train_sampling_strategy=sequential"
        " --set per_device_train_batch_size=4 --set gradient_accumulation_steps=4 --set max_steps=10"
        " --set learning_rate=3e-3 --set weight_decay=0.1 --set lr_scheduler_type=cosine --set warmup_steps=2"
        " --set max_grad_norm=1.0 --set threads=2 --set seed=5 --set dtype=" +
        dtype + " --set loss_normalization=" + normalization;
    return gradaccum::testing::train_steps(args, dir_ + "/run-" + dtype + "-" + normalization);
  }

  // The largest relative difference of `key` over the steps (EXPECTs equal step counts).
  static double largest_difference(const std::vector<nlohmann::json>& ours, const std::vector<nlohmann::json>& theirs,
                                   const std::string& key) {
    EXPECT_EQ(ours.size(), theirs.size());
    double largest = 0.0;
    for (size_t i = 0; i < std::min(ours.size(), theirs.size()); ++i) {
      largest = std::max(
          largest, gradaccum::testing::relative_difference(ours[i][key].get<double>(), theirs[i][key].get<double>()));
    }
    return largest;
  }

  // The loop HF Accelerate's documentation (and seed 004) teaches, each micro-batch's mean divided
  // by the accumulation steps, is gradaccum's `micro_batch` mode, step for step; it is not the
  // Trainer's trajectory: with micro_batch normalization this parity test fails by far more than
  // its tolerance (the differences are printed; the README quotes them).
  static void expect_micro_batch_mode_is_accelerates_loop() {
    const auto naive = train("float64", "micro_batch");
    const auto accelerate = peer("accelerate-float64");
    EXPECT_LE(largest_difference(naive, accelerate, "loss"), 1e-10);
    EXPECT_LE(largest_difference(naive, accelerate, "grad_norm"), 1e-10);
    const auto trainer = peer("trainer-float64");
    const double loss_gap = largest_difference(naive, trainer, "loss");
    const double norm_gap = largest_difference(naive, trainer, "grad_norm");
    std::printf("micro-batch means / N vs the Trainer over 10 steps (float64): loss %.3g, grad norm %.3g\n", loss_gap,
                norm_gap);
    EXPECT_GT(loss_gap, 1e-4);
    EXPECT_GT(norm_gap, 1e-2);
  }

  static std::string dir_, tokenizer_;
  static int status_;

 public:
  static const std::string& dir() { return dir_; }
};
std::string HfTrainerParity::dir_, HfTrainerParity::tokenizer_;
int HfTrainerParity::status_ = -1;

// (2b) The Trainer on a PEFT LoRA model (tests/hf/peft_trainer_parity.py): gradaccum, starting
// from PEFT's adapter (lora.init_from) on the same Llama base and data, follows it step for step
// in float64 and ends with the same adapter; without lora.init_from (fresh adapters) it does not.
class HfTrainerPeftParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto made =
        shared_hf_script("peft_trainer_parity.py", gradaccum::testing::gpt2_tokenizer_dir() + "/gpt2.tiktoken");
    dir_ = made.dir;
    error_ = made.error;
    work_ = gradaccum::testing::make_temp_dir("hf-trainer-peft-parity");
  }
  void SetUp() override {
    ASSERT_EQ(error_, "") << "tests/hf/peft_trainer_parity.py (transformers and peft in the venv?)";
  }
  // dir_: the Trainer's reference (shared, read only); work_: this process's runs.
  static std::string dir_, error_, work_;
};
std::string HfTrainerPeftParity::dir_, HfTrainerPeftParity::error_, HfTrainerPeftParity::work_;

TEST_F(HfTrainerPeftParity, GradaccumFromPeftsAdapterFollowsTheTrainerAndEndsWithItsAdapter) {
  std::ifstream in(dir_ + "/trainer-float64.json");
  const auto trainer = nlohmann::json::parse(in).get<std::vector<nlohmann::json>>();
  ASSERT_EQ(trainer.size(), 10u);
  const auto train = [&](const std::string& init_from, const std::string& out) {
    const std::string args =
        "--set model.hf_checkpoint=" + dir_ + "/model --set data.type=text --set data.path=" + dir_ +
        "/train.jsonl --set data.tokenizer=" + gradaccum::testing::gpt2_tokenizer_dir() +
        " --set data.max_length=48 --set data.eval_fraction=0 --set train_sampling_strategy=sequential"
        " --set per_device_train_batch_size=4 --set gradient_accumulation_steps=4 --set max_steps=10"
        " --set learning_rate=3e-3 --set weight_decay=0.1 --set lr_scheduler_type=cosine --set warmup_steps=2"
        " --set max_grad_norm=1.0 --set threads=2 --set seed=5 --set dtype=float64 --set loss_normalization=window"
        " --set lora.target_modules=[q_proj,v_proj,down_proj] --set lora.r=4 --set lora.alpha=8" +
        (init_from.empty() ? std::string() : " --set lora.init_from=" + init_from);
    return gradaccum::testing::train_steps(args, out);
  };
  const auto ours = train(dir_ + "/adapter-init", work_ + "/run");
  ASSERT_EQ(ours.size(), trainer.size());
  double loss_gap = 0, norm_gap = 0, lr_gap = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    using gradaccum::testing::relative_difference;
    loss_gap = std::max(loss_gap, relative_difference(ours[i]["loss"].get<double>(), trainer[i]["loss"].get<double>()));
    norm_gap = std::max(norm_gap,
                        relative_difference(ours[i]["grad_norm"].get<double>(), trainer[i]["grad_norm"].get<double>()));
    lr_gap = std::max(lr_gap, std::abs(ours[i]["lr"].get<double>() - trainer[i]["lr"].get<double>()));
  }
  std::printf(
      "[ measured ] gradaccum + LoRA vs the Trainer + PEFT over 10 steps (float64): loss %.3g, grad norm %.3g\n",
      loss_gap, norm_gap);
  EXPECT_LE(loss_gap, 1e-10);
  EXPECT_LE(norm_gap, 1e-10);
  EXPECT_LE(lr_gap, 1e-15);

  // The trained adapter is PEFT's, tensor for tensor, and it moved away from where it started.
  const auto theirs = formats::load_safetensors(dir_ + "/adapter-final/adapter_model.safetensors");
  const auto start = formats::load_safetensors(dir_ + "/adapter-init/adapter_model.safetensors");
  const auto mine = formats::load_safetensors(work_ + "/run/final/adapter_model.safetensors");
  ASSERT_EQ(mine.size(), theirs.size());
  ASSERT_EQ(theirs.size(), 2u * 3u * 2u);  // A and B, three targets, two layers
  std::map<std::string, torch::Tensor> by_name(theirs.begin(), theirs.end());
  double largest = 0, moved = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    ASSERT_EQ(by_name.count(mine[i].first), 1u) << mine[i].first;
    largest = std::max(largest, max_relative_difference(mine[i].second, by_name.at(mine[i].first)));
    moved = std::max(moved, max_relative_difference(start[i].second, theirs[i].second));
  }
  EXPECT_LE(largest, 1e-10);
  EXPECT_GT(moved, 1e-3);

  // Fresh adapters (B at zero) are another trajectory: lora.init_from is what made them agree.
  const auto fresh = train("", work_ + "/run-fresh");
  ASSERT_EQ(fresh.size(), trainer.size());
  EXPECT_GT(gradaccum::testing::relative_difference(fresh.front()["grad_norm"].get<double>(),
                                                    trainer.front()["grad_norm"].get<double>()),
            1e-3);
}

// A lora.init_from that disagrees with the section is refused in one line naming the key.
TEST_F(HfTrainerPeftParity, AnInitAdapterThatDisagreesWithTheSectionIsRefused) {
  const std::string base = "train --set model.hf_checkpoint=" + dir_ +
                           "/model --set data.type=text --set data.path=" + dir_ +
                           "/train.jsonl --set data.tokenizer=" + gradaccum::testing::gpt2_tokenizer_dir() +
                           " --set data.eval_fraction=0 --set max_steps=1 --set output_dir=" + work_ + "/refused" +
                           " --set lora.init_from=" + dir_ + "/adapter-init --set lora.alpha=8";
  const auto r8 =
      gradaccum::testing::run_cli(base + " --set lora.target_modules=[q_proj,v_proj,down_proj] --set lora.r=8");
  EXPECT_NE(r8.exit_code, 0);
  EXPECT_NE(
      r8.err.find("key 'lora.init_from': " + dir_ + "/adapter-init/adapter_config.json has r 4, the lora section 8"),
      std::string::npos)
      << r8.err;
  const auto targets = gradaccum::testing::run_cli(base + " --set lora.target_modules=[q_proj,v_proj] --set lora.r=4");
  EXPECT_NE(targets.exit_code, 0);
  EXPECT_NE(targets.err.find("has target_modules [down_proj, q_proj, v_proj], the lora section [q_proj, v_proj]"),
            std::string::npos)
      << targets.err;
  const auto missing = gradaccum::testing::run_cli(base +
                                                   " --set lora.target_modules=[q_proj] --set lora.r=4 --set "
                                                   "lora.init_from=" +
                                                   dir_ + "/model");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("key 'lora.init_from': " + dir_ + "/model has no adapter_config.json"), std::string::npos)
      << missing.err;
}

// transformers 5.24's Trainer counts a GPT2LMHeadModel's targets without the causal shift
// (its loss_type is None, see trainer_parity.py), so it divides the first window by tokens +
// rows: its stock loss is gradaccum's times tokens / (tokens + rows), exactly (float32 logits
// in its loss: to 1e-6).
void expect_stock_trainer_over_counts(const nlohmann::json& first_step) {
  std::ifstream in(HfTrainerParity::dir() + "/trainer-stock.json");
  const auto stock = nlohmann::json::parse(in);
  ASSERT_EQ(stock.size(), 1u);
  const double tokens = first_step["items"].get<double>(), rows = first_step["samples"].get<double>();
  EXPECT_EQ(rows, 16);
  const double loss = first_step["loss"].get<double>(), stock_loss = stock[0]["loss"].get<double>();
  EXPECT_LE(gradaccum::testing::relative_difference(stock_loss, loss * tokens / (tokens + rows)), 1e-6);
  EXPECT_GT(gradaccum::testing::relative_difference(stock_loss, loss), 0.01);
}

// The Trainer normalizes each window by its token count (num_items_in_batch, transformers
// >= 4.46), as gradaccum's `window` mode does: the same loss, pre-clip grad norm and learning
// rate at every one of the 10 steps (and the stock Trainer's first step differs as said
// above; and the Accelerate loop is the `micro_batch` mode, below). In float32 the losses agree to ~2e-7, but the
// Trainer's grad norm carries torch's float32 norm of the 1.6M-element embedding gradient (3.6e-5 off on that
// tensor, 5.4e-6 on the total at step 1, 5e-4 by step 10 as measured): gradaccum's float32 run stays within 1e-6 of the
// float64 Trainer, and within 1e-3 of the float32 one.
TEST_F(HfTrainerParity, GradaccumFollowsTheHfTrainerStepForStep) {
  const auto trainer64 = peer("trainer-float64"), trainer32 = peer("trainer-float32");
  for (const std::string dtype : {"float64", "float32"}) {
    const auto ours = train(dtype, "window");
    ASSERT_EQ(ours.size(), 10u) << dtype;
    const double tolerance = dtype == "float64" ? 1e-10 : 1e-6;
    EXPECT_LE(largest_difference(ours, trainer64, "loss"), tolerance) << dtype;
    EXPECT_LE(largest_difference(ours, trainer64, "grad_norm"), tolerance) << dtype;
    EXPECT_LE(largest_difference(ours, trainer64, "lr"), 1e-12) << dtype;
    if (dtype == "float32") {
      EXPECT_LE(largest_difference(ours, trainer32, "loss"), 1e-4);
      EXPECT_LE(largest_difference(ours, trainer32, "grad_norm"), 1e-3);
      EXPECT_LE(largest_difference(ours, trainer32, "lr"), 1e-12);
    }
    // Of substance: clipping acts (grad norm > 1 at some step) and the loss falls.
    double largest_norm = 0.0;
    for (const auto& r : ours) largest_norm = std::max(largest_norm, r["grad_norm"].get<double>());
    EXPECT_GT(largest_norm, 1.0) << dtype;
    EXPECT_LT(ours.back()["loss"].get<double>(), ours.front()["loss"].get<double>() - 0.5) << dtype;
    // Every micro-batch is padded: the window holds fewer tokens than 16 rows of 48.
    EXPECT_LT(ours.front()["items"].get<int64_t>(), 16 * 47) << dtype;
    if (dtype == "float64") expect_stock_trainer_over_counts(ours.front());
  }
  expect_micro_batch_mode_is_accelerates_loop();
}

// `gradaccum eval` on a checkpoint a gradaccum run wrote (final/, after 3 steps on KJV verses)
// gives transformers' loss, perplexity and token count on the same text: GPT-2 (documents cut
// at its 32 positions) and BLOOM, both in float32, to 1e-5 relative.
TEST(HfEval, GradaccumEvalGivesTransformersPerplexity) {
  const auto dir = gradaccum::testing::make_temp_dir("hf-eval");
  const std::string common =
      "--set model.n_layer=1 --set model.n_embd=16 --set model.n_head=2 --set model.n_positions=32 "
      "--set data.type=kjv --set data.max_length=16 --set data.train_limit=96 --set data.eval_limit=-1 "
      "--set max_steps=3 --set threads=2 --set learning_rate=1e-2 --set seed=7 "
      "--set per_device_train_batch_size=8 --set gradient_accumulation_steps=4";
  nlohmann::json checkpoints = nlohmann::json::array();
  for (const std::string type : {"gpt2", "bloom"}) {
    gradaccum::testing::train_steps(common + " --set model.type=" + type, dir + "/" + type);
    checkpoints.push_back(dir + "/" + type + "/final");
  }
  std::ofstream(dir + "/checkpoints.json") << checkpoints.dump();
  // A blank line (skipped), a one-token line (nothing to predict), a line longer than GPT-2's
  // 32 positions, and lines of different lengths batched together (--batch-size 3: padding).
  std::ofstream(dir + "/eval.txt")
      << "In the beginning God created the heaven and the earth.\n\n"
      << "Amen\n"
      << "Jesus wept.\n"
      << "And the evening and the morning were the first day, and God saw every thing that he had made, "
         "and, behold, it was very good; and the evening and the morning were the sixth day.\n"
      << "Blessed are the meek: for they shall inherit the earth.\n";
  ASSERT_EQ(run_hf_script("eval_perplexity.py", dir), 0) << "tests/hf/eval_perplexity.py failed:\n"
                                                         << tail_of(dir + "/log");
  std::ifstream in(dir + "/perplexity.json");
  const auto reference = nlohmann::json::parse(in);
  for (const auto& checkpoint : checkpoints) {
    const auto result = gradaccum::testing::run_cli("eval --checkpoint " + checkpoint.get<std::string>() + " " + dir +
                                                    "/eval.txt --batch-size 3");
    ASSERT_EQ(result.exit_code, 0) << result.err;
    const auto ours = nlohmann::json::parse(result.out);
    const auto& theirs = reference.at(checkpoint.get<std::string>());
    EXPECT_EQ(ours["tokens"], theirs["tokens"]) << checkpoint;
    EXPECT_LE(gradaccum::testing::relative_difference(ours["loss"].get<double>(), theirs["loss"].get<double>()), 1e-5)
        << checkpoint;
    EXPECT_LE(
        gradaccum::testing::relative_difference(ours["perplexity"].get<double>(), theirs["perplexity"].get<double>()),
        1e-5)
        << checkpoint;
    // Of substance: trained (3 steps), so below the uniform ln(50257) = 10.825 nats.
    EXPECT_LT(ours["loss"].get<double>(), 10.8) << checkpoint;
    EXPECT_GT(ours["tokens"].get<int64_t>(), 50) << checkpoint;
  }
  EXPECT_EQ(reference.at(checkpoints[0].get<std::string>())["model_class"], "GPT2LMHeadModel");
  EXPECT_EQ(reference.at(checkpoints[1].get<std::string>())["model_class"], "BloomForCausalLM");
  // The long line is cut at GPT-2's 32 positions and whole for BLOOM.
  EXPECT_LT(reference.at(checkpoints[0].get<std::string>())["tokens"].get<int64_t>(),
            reference.at(checkpoints[1].get<std::string>())["tokens"].get<int64_t>());
  fs::remove_all(dir);
}

}  // namespace hf_interop_test
