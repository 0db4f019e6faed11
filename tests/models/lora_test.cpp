// LoRA adapters (models/lora.h). (1) PEFT itself as the reference (tests/hf/peft_adapters.py, run
// with the venv's Python): on Llama, Qwen2, GPT-2 and BLOOM tiny random models (odd ranks,
// different target sets, an untied head and a classifier's score trained whole, rsLoRA), PEFT's
// saved adapters (B nonzero) load here with PEFT's logits (≤ 1e-12 relative in float64, ≤ 1e-5 in
// float32); merged into the base (in-process and by `gradaccum export --merge-lora`) they give the
// same logits; adapters written here load in PEFT with no missing or unexpected key and PEFT's
// float64 logits equal ours. (2) The engine with adapters: the base stays bit-identical, the
// optimizer holds state for the adapters and modules_to_save only, a stop inside a window resumes
// bit-identically, `verify` finds padded splits exact in float64, two ranks equal one process and
// all-reduce the adapters' bytes only, and a run writes PEFT's files into its checkpoints and final/.
// (3) Bad input: one-line errors.
#include "gradaccum/models/lora.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "gradaccum/core/trainer.h"
#include "gradaccum/data/random_tokens.h"
#include "gradaccum/formats/safetensors.h"
#include "gradaccum/models/built_model.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/hf_checkpoint.h"
#include "gradaccum/models/sequence_classifier.h"
#include "gradaccum/optim/optimizer_state.h"
#include "stop_inside_window.h"
#include "test_support.h"
#include "tiny_decoders.h"

namespace lora_test {

namespace fs = std::filesystem;
using namespace gradaccum;
using gradaccum::testing::make_temp_dir;
using gradaccum::testing::max_relative_difference;
using gradaccum::testing::run_cli;

// Runs tests/hf/peft_adapters.py DIR MODE with the venv's Python, its output into DIR/log-MODE.
int run_peft_script(const std::string& dir, const std::string& mode) {
  const std::string path = std::string(GRADACCUM_TEST_DATA) + "/../hf/peft_adapters.py";
  const std::string command = "'" + gradaccum::testing::venv_program("python") + "' -B '" + path + "' '" + dir + "' " +
                              mode + " > '" + dir + "/log-" + mode + "' 2>&1";
  return std::system(command.c_str());
}

std::string tail_of(const std::string& path) {
  const auto text = gradaccum::testing::read_text(path);
  return text.size() > 2000 ? text.substr(text.size() - 2000) : text;
}

torch::Tensor named(const formats::NamedTensors& tensors, const std::string& key) {
  for (const auto& [k, t] : tensors) {
    if (k == key) return t;
  }
  ADD_FAILURE() << "no tensor " << key;
  return torch::Tensor();
}

torch::Tensor forward(models::BuiltModel& model, const torch::Tensor& ids, const torch::Tensor& mask) {
  torch::NoGradGuard no_grad;
  auto& module = model.task->module();
  module.eval();
  if (auto* lm = dynamic_cast<models::CausalLmHeadImpl*>(&module)) return lm->forward(ids, mask);
  auto* classifier = dynamic_cast<models::SequenceClassificationModelImpl*>(&module);
  EXPECT_NE(classifier, nullptr);
  return classifier->forward(ids, mask);
}

// max |Δ| / max |reference| over the positions both define: a causal LM's real tokens, every row
// of a classifier.
double difference(const torch::Tensor& ours, const torch::Tensor& reference, const torch::Tensor& mask,
                  int64_t labels) {
  const auto real = labels == 0 ? mask.to(torch::kBool) : torch::ones({mask.size(0)}, torch::kBool);
  return max_relative_difference(ours.to(torch::kDouble).index({real}), reference.to(torch::kDouble).index({real}));
}

int64_t count_adapters(const models::BuiltModel& model) {
  return model.lora ? static_cast<int64_t>(model.lora->adapted.size()) : 0;
}

class PeftAdapters : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = make_temp_dir("peft-adapters");
    status_ = run_peft_script(dir_, "make");
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    ASSERT_EQ(status_, 0) << "tests/hf/peft_adapters.py make failed (peft in the venv?):\n"
                          << tail_of(dir_ + "/log-make");
  }
  static nlohmann::json cases() {
    std::ifstream in(dir_ + "/cases.json");
    return nlohmann::json::parse(in);
  }
  static std::string dir_;
  static int status_;
};
std::string PeftAdapters::dir_;
int PeftAdapters::status_ = -1;

TEST_F(PeftAdapters, PeftsAdaptersLoadAndGivePeftsLogits) {
  int compared = 0;
  for (const auto& c : cases()) {
    const std::string name = c["name"];
    const int64_t labels = c["labels"];
    const auto case_dir = dir_ + "/" + name;
    const auto reference = formats::load_safetensors(case_dir + "/reference.safetensors");
    const auto ids = named(reference, "input_ids"), mask = named(reference, "attention_mask");
    for (const auto dtype : {torch::kDouble, torch::kFloat}) {
      auto model = models::load_language_model_with_adapter(case_dir + "/peft", case_dir + "/base");
      EXPECT_EQ(count_adapters(model), 2 * static_cast<int64_t>(c["lora"]["target_modules"].size())) << name;
      model.task->module().to(dtype);
      const auto logits = forward(model, ids, mask);
      const auto expected = named(reference, dtype == torch::kDouble ? "logits64" : "logits32");
      ASSERT_EQ(logits.sizes(), expected.sizes()) << name;
      EXPECT_LE(difference(logits, expected, mask, labels), dtype == torch::kDouble ? 1e-12 : 1e-5)
          << name << (dtype == torch::kDouble ? " in float64" : " in float32");
      ++compared;
    }
    // Of substance: the adapters move the logits away from the base's.
    auto base = models::load_language_model(case_dir + "/base", labels, 0);
    base.task->module().to(torch::kDouble);
    EXPECT_GT(difference(forward(base, ids, mask), named(reference, "logits64"), mask, labels), 1e-3) << name;
  }
  EXPECT_EQ(compared, 2 * 4);
}

TEST_F(PeftAdapters, MergedIntoTheBaseTheyGiveTheUnmergedLogits) {
  for (const auto& c : cases()) {
    const std::string name = c["name"];
    const int64_t labels = c["labels"];
    const auto case_dir = dir_ + "/" + name;
    const auto reference = formats::load_safetensors(case_dir + "/reference.safetensors");
    const auto ids = named(reference, "input_ids"), mask = named(reference, "attention_mask");
    // In float64: W + scaling · B·A in the layer itself.
    auto model = models::load_language_model_with_adapter(case_dir + "/peft", case_dir + "/base");
    model.task->module().to(torch::kDouble);
    models::merge_lora(model);
    EXPECT_EQ(model.lora, nullptr);
    for (const auto& item : model.task->module().named_parameters()) {
      EXPECT_EQ(item.key().find("lora_"), std::string::npos) << item.key();
    }
    EXPECT_LE(difference(forward(model, ids, mask), named(reference, "logits64"), mask, labels), 1e-12) << name;
    // Through the program: an HF checkpoint in the base's float32.
    const auto merged = case_dir + "/merged";
    const auto r = run_cli("export --merge-lora " + case_dir + "/peft " + merged + " --base " + case_dir + "/base");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto loaded = models::load_language_model(merged, labels, 0);
    EXPECT_EQ(loaded.hf_config["architectures"], model.hf_config["architectures"]) << name;
    EXPECT_LE(difference(forward(loaded, ids, mask), named(reference, "logits32"), mask, labels), 1e-5) << name;
  }
}

TEST_F(PeftAdapters, GradaccumsAdaptersLoadInPeftWithTheSameLogits) {
  int written = 0;
  for (const auto& c : cases()) {
    const std::string name = c["name"];
    const int64_t labels = c["labels"];
    const auto case_dir = dir_ + "/" + name;
    auto model = models::load_language_model(case_dir + "/base", labels, 0);
    auto config = c["lora"];
    config["peft_type"] = "LORA";
    const auto lora = models::lora_config_from_peft(config, name);
    models::attach_lora(model, lora, 5, models::DropoutRng::per_sample, case_dir + "/base");
    {
      // Every trained tensor redrawn: a fresh B is zero and would hide a wrong adapter.
      torch::NoGradGuard no_grad;
      torch::manual_seed(17 + written);
      for (auto& p : model.task->module().parameters()) {
        if (p.requires_grad()) p.copy_(0.3 * torch::randn_like(p));
      }
    }
    const auto ours = case_dir + "/ours";
    fs::create_directories(ours);
    formats::save_safetensors(ours + "/adapter_model.safetensors", model.weights());
    std::ofstream(ours + "/adapter_config.json") << models::peft_adapter_config(*model.lora).dump(2);
    const auto reference = formats::load_safetensors(case_dir + "/reference.safetensors");
    const auto ids = named(reference, "input_ids"), mask = named(reference, "attention_mask");
    model.task->module().to(torch::kDouble);
    formats::save_safetensors(
        ours + "/reference.safetensors",
        {{"input_ids", ids}, {"attention_mask", mask}, {"logits64", forward(model, ids, mask).contiguous()}});
    ++written;
  }
  ASSERT_EQ(written, 4);
  ASSERT_EQ(run_peft_script(dir_, "check"), 0) << "tests/hf/peft_adapters.py check failed:\n"
                                               << tail_of(dir_ + "/log-check");
  std::ifstream in(dir_ + "/results.json");
  const auto results = nlohmann::json::parse(in);
  const std::map<std::string, std::string> classes = {{"llama-lm", "PeftModelForCausalLM"},
                                                      {"qwen2-cls", "PeftModelForSequenceClassification"},
                                                      {"gpt2-lm", "PeftModelForCausalLM"},
                                                      {"bloom-lm", "PeftModelForCausalLM"}};
  ASSERT_EQ(results.size(), classes.size());
  for (const auto& [name, peft_class] : classes) {
    const auto& r = results.at(name);
    EXPECT_EQ(r["peft_class"], peft_class);
    EXPECT_TRUE(r["missing"].empty()) << name << ": " << r["missing"].dump();
    EXPECT_TRUE(r["unexpected"].empty()) << name << ": " << r["unexpected"].dump();
    EXPECT_LE(r["max_relative_difference"].get<double>(), 1e-12) << name;
    EXPECT_GT(r["max_abs_logit"].get<double>(), 0.1) << name;
  }
}

TEST_F(PeftAdapters, AnAdapterOfAnotherShapeOrKindIsAOneLineError) {
  const auto case_dir = dir_ + "/llama-lm";
  const auto bad = dir_ + "/bad";
  fs::create_directories(bad);
  fs::copy_file(case_dir + "/peft/adapter_config.json", bad + "/adapter_config.json");
  // One A of another input width than its layer's.
  auto tensors = formats::load_safetensors(case_dir + "/peft/adapter_model.safetensors");
  for (auto& [name, tensor] : tensors) {
    if (name == "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight") tensor = torch::zeros({3, 31});
  }
  formats::save_safetensors(bad + "/adapter_model.safetensors", tensors);
  EXPECT_EQ(gradaccum::testing::error_of([&] { models::load_language_model_with_adapter(bad, case_dir + "/base"); }),
            bad +
                "/adapter_model.safetensors: tensor model.layers.1.self_attn.v_proj.lora_A.weight: shape [3, 31] does "
                "not match the model's [3, 32]");
  // Another PEFT method.
  auto config = nlohmann::json::parse(gradaccum::testing::read_text(case_dir + "/peft/adapter_config.json"));
  config["peft_type"] = "IA3";
  std::ofstream(bad + "/adapter_config.json") << config.dump();
  EXPECT_EQ(gradaccum::testing::error_of([&] { models::load_language_model_with_adapter(bad, case_dir + "/base"); }),
            bad + "/adapter_config.json: \"peft_type\" is \"IA3\"; only LORA adapters load");
  // Through the program: one line, exit status 1.
  const auto r = run_cli("eval --checkpoint " + bad + " --base " + case_dir + "/base " + bad + "/adapter_config.json");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "gradaccum: error: " + bad + "/adapter_config.json: \"peft_type\" is \"IA3\"; only LORA adapters load\n");
}

// ---- The engine with adapters, in-process ----

models::LoraConfig tiny_lora() {
  models::LoraConfig l;
  l.r = 3;
  l.alpha = 6.0;
  l.dropout = 0.2;
  l.target_modules = {"q_proj", "v_proj", "down_proj"};
  l.modules_to_save = {"norm"};  // the final norm (model.norm), trained whole
  return l;
}

models::BuiltModel tiny_lora_model() {
  auto model = models::make_language_model("llama", gradaccum::testing::tiny_llama_config(), 61, 0, 3);
  models::attach_lora(model, tiny_lora(), 9, models::DropoutRng::per_sample, "");
  return model;
}

core::TrainerOptions tiny_options() {
  core::TrainerOptions options;
  options.per_device_train_batch_size = 2;
  options.gradient_accumulation_steps = 3;
  options.max_steps = 4;
  options.optimizer.learning_rate = 0.05;
  options.dtype = torch::kDouble;
  options.seed = 4;
  return options;
}

TEST(Lora, AFreshAdapterIsPeftsInitAndLeavesTheLogitsAlone) {
  auto base = models::make_language_model("llama", gradaccum::testing::tiny_llama_config(), 61, 0, 3);
  auto model = tiny_lora_model();
  ASSERT_NE(model.lora, nullptr);
  // q, v and down in each of 2 layers; A ~ U(±1/√in), B = 0; scaling alpha / r.
  EXPECT_EQ(model.lora->adapted.size(), 6u);
  EXPECT_EQ(model.lora->adapted.front(), "transformer.layers.0.self_attn.q_proj");
  EXPECT_EQ(model.lora->saved, std::vector<std::string>{"transformer.norm"});
  int64_t trainable = 0;
  for (const auto& item : model.task->module().named_parameters()) {
    const auto& p = item.value();
    if (!p.requires_grad()) continue;
    trainable += p.numel();
    if (item.key().find("lora_B") != std::string::npos) EXPECT_EQ(p.abs().max().item<double>(), 0.0) << item.key();
    if (item.key().find("lora_A") != std::string::npos) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.size(1)));
      EXPECT_LE(p.abs().max().item<double>(), bound) << item.key();
      EXPECT_GT(p.abs().max().item<double>(), 0.8 * bound) << item.key();
    }
  }
  // Per layer: q 3·32 + 32·3, v 3·32 + 16·3, down 3·40 + 32·3; the norm 32.
  EXPECT_EQ(trainable, 2 * (192 + 144 + 216) + 32);
  EXPECT_DOUBLE_EQ(tiny_lora().scaling(), 2.0);
  auto rslora = tiny_lora();
  rslora.use_rslora = true;
  EXPECT_DOUBLE_EQ(rslora.scaling(), 6.0 / std::sqrt(3.0));
  const auto ids = torch::randint(0, 61, {2, 7}, torch::kLong);
  EXPECT_TRUE(torch::equal(forward(model, ids, {}), forward(base, ids, {})));
}

TEST(Lora, TheBaseStaysBitIdenticalAndOnlyTrainedTensorsHoldOptimizerState) {
  auto model = tiny_lora_model();
  auto& module = model.task->module();
  std::map<std::string, torch::Tensor> start;
  for (const auto& item : module.named_parameters()) start[item.key()] = item.value().detach().clone();
  const auto data = data::make_random_tokens_data(61, 12, 24, 0, 4);
  core::ObserverList quiet;
  core::Trainer trainer(tiny_options(), *model.task, *data.train, nullptr, quiet);
  trainer.run();
  int64_t frozen = 0, changed = 0;
  optim::NamedParameters all;
  for (const auto& item : module.named_parameters()) {
    const auto& p = item.value();
    all.emplace_back(item.key(), p);
    if (p.requires_grad()) {
      changed += torch::equal(p.to(torch::kFloat), start.at(item.key())) ? 0 : 1;
      continue;
    }
    ++frozen;
    EXPECT_FALSE(p.grad().defined()) << item.key();
    EXPECT_EQ(p.scalar_type(), torch::kDouble);
    EXPECT_TRUE(torch::equal(p.to(torch::kFloat), start.at(item.key()))) << item.key();
  }
  EXPECT_EQ(frozen, 1 + 2 * 9);   // the embedding; per layer two norms and the seven projections
  EXPECT_EQ(changed, 6 * 2 + 1);  // every adapter matrix and the norm
  // AdamW's state: step, exp_avg and exp_avg_sq for each of the 13 trained tensors, nothing else.
  std::set<std::string> holders;
  const auto state = optim::optimizer_state(trainer.optimizer(), all);
  for (const auto& [name, tensor] : state) holders.insert(name.substr(0, name.rfind('.')));
  EXPECT_EQ(state.size(), 3u * 13u);
  EXPECT_EQ(holders.size(), 13u);
  for (const auto& holder : holders) {
    EXPECT_TRUE(holder.find(".lora_") != std::string::npos || holder == "transformer.norm.weight") << holder;
  }
  EXPECT_EQ(trainer.named_parameters().size(), 13u);
}

// lora.base_dtype bfloat16: the frozen Linear weights stay in 16 bits through the trainer's
// placement in float32, while the adapters (so their gradients) and AdamW's moments are float32; the
// first loss is the float32 base's to bfloat16's rounding.
TEST(Lora, ABfloat16BaseStaysBfloat16AndTheAdaptersTrainInFloat32) {
  auto lora = tiny_lora();
  lora.base_dtype = torch::kBFloat16;
  auto model = models::make_language_model("llama", gradaccum::testing::tiny_llama_config(), 61, 0, 3);
  models::attach_lora(model, lora, 9, models::DropoutRng::per_sample, "");
  auto reference = tiny_lora_model();
  const auto data = data::make_random_tokens_data(61, 12, 24, 0, 4);
  auto options = tiny_options();
  options.dtype = torch::kFloat;
  options.max_steps = 2;
  struct Losses final : core::TrainingObserver {
    void on_step(const core::StepRecord& r) override { loss.push_back(r.loss); }
    std::vector<double> loss;
  } bf16_losses, float_losses;
  core::Trainer trainer(options, *model.task, *data.train, nullptr, bf16_losses);
  trainer.run();
  core::Trainer(options, *reference.task, *data.train, nullptr, float_losses).run();
  int64_t sixteen_bit = 0;
  for (const auto& item : model.task->module().named_parameters()) {
    const auto& p = item.value();
    const bool projection = item.key().find("_proj.weight") != std::string::npos;
    EXPECT_EQ(p.scalar_type(), projection ? torch::kBFloat16 : torch::kFloat) << item.key();
    sixteen_bit += projection ? 1 : 0;
  }
  EXPECT_EQ(sixteen_bit, 2 * 7);
  for (const auto& [name, tensor] : optim::optimizer_state(trainer.optimizer(), trainer.named_parameters())) {
    if (tensor.dim() > 0) EXPECT_EQ(tensor.scalar_type(), torch::kFloat) << name;
  }
  ASSERT_EQ(bf16_losses.loss.size(), 2u);
  EXPECT_TRUE(std::isfinite(bf16_losses.loss[1]));
  EXPECT_NEAR(bf16_losses.loss[0], float_losses.loss[0], 2e-2 * float_losses.loss[0]);
  EXPECT_NE(bf16_losses.loss[0], float_losses.loss[0]);
}

// A stop during a window's second micro-step, saved as a LoRA run saves (PEFT's adapter tensors),
// restored into a fresh model: the same adapters, bit for bit, as the run that was not stopped.
TEST(Lora, AStopInsideAWindowResumesBitIdentically) {
  const auto data = data::make_random_tokens_data(61, 12, 24, 0, 4);
  core::ObserverList quiet;
  auto options = tiny_options();
  auto straight = tiny_lora_model();
  core::Trainer(options, *straight.task, *data.train, nullptr, quiet).run();

  std::atomic<bool> stop{false};
  gradaccum::testing::StopAfterFetches stopping(*data.train, stop, 3 + 2);  // step 1, then 2 of step 2's 3
  auto first = tiny_lora_model();
  core::Trainer stopped(options, *first.task, stopping, nullptr, quiet);
  gradaccum::testing::MemoryHook hook;
  hook.optimizer_ = &stopped.optimizer();
  hook.names_ = stopped.named_parameters();
  hook.module_ = &first.task->module();
  stopped.set_checkpointing(&hook, &stop);
  ASSERT_TRUE(stopped.run().preempted);
  EXPECT_EQ(hook.saved.position.step, 1);
  EXPECT_EQ(hook.saved.position.micro_step, 2);
  EXPECT_EQ(core::Preemption::partial_window(hook.saved).grads.size(), 13u);  // the trained tensors' sums only
  const auto adapters = first.weights();
  EXPECT_EQ(adapters.size(), 13u);
  EXPECT_EQ(adapters.front().first, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");

  auto second = tiny_lora_model();
  core::Trainer resumed(options, *second.task, *data.train, nullptr, quiet);
  second.load_weights(adapters, "memory");
  optim::load_optimizer_state(resumed.optimizer(), resumed.named_parameters(),
                              formats::parse_safetensors(hook.optimizer, "memory"), "memory");
  resumed.restore(hook.saved);
  EXPECT_FALSE(resumed.run().preempted);
  const auto a = straight.weights(), b = second.weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
}

TEST(Lora, TargetsThatMatchNothingAndImpossibleSettingsAreOneLineErrors) {
  auto attach = [](models::LoraConfig lora) {
    auto model = models::make_language_model("llama", gradaccum::testing::tiny_llama_config(), 61, 0, 3);
    models::attach_lora(model, lora, 0, models::DropoutRng::per_sample, "");
  };
  auto lora = tiny_lora();
  lora.target_modules = {"q_proj", "c_attn"};
  EXPECT_EQ(gradaccum::testing::error_of([&] { attach(lora); }),
            "key 'lora.target_modules': 'c_attn' matches none of the Llama model's Linear layers (q_proj, k_proj, "
            "v_proj, o_proj, gate_proj, up_proj, down_proj)");
  lora = tiny_lora();
  lora.modules_to_save = {"classifier"};
  EXPECT_EQ(gradaccum::testing::error_of([&] { attach(lora); }),
            "key 'lora.modules_to_save': 'classifier' matches no module of the Llama model");
  lora = tiny_lora();
  lora.r = 0;
  EXPECT_EQ(gradaccum::testing::error_of([&] { attach(lora); }), "key 'lora.r': must be > 0, got 0");
  lora = tiny_lora();
  lora.alpha = -1;
  EXPECT_EQ(gradaccum::testing::error_of([&] { attach(lora); }), "key 'lora.alpha': must be > 0, got -1");
  // The configuration refuses them first, naming the key.
  const std::string run = "train --set model.type=llama --set data.type=random_tokens --set data.vocab_size=40 ";
  for (const auto& [set, message] : std::vector<std::pair<std::string, std::string>>{
           {"--set lora.target_modules=[q_proj,wq]",
            "key 'lora.target_modules': 'wq' matches none of the Llama model's Linear layers (q_proj, k_proj, v_proj, "
            "o_proj, gate_proj, up_proj, down_proj)"},
           {"--set lora.target_modules=[q_proj] --set lora.r=0", "key 'lora.r': must be > 0, got 0"},
           {"--set lora.target_modules=[q_proj] --set lora.alpha=0", "key 'lora.alpha': must be > 0, got 0"},
           {"--set lora.modules_to_save=[score]", "key 'lora.modules_to_save': needs lora.target_modules"}}) {
    const auto r = run_cli(run + set);
    EXPECT_EQ(r.exit_code, 1) << set;
    EXPECT_EQ(r.err.rfind("gradaccum: error: " + message, 0), 0u) << set << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

// ---- The program with adapters ----

// A tiny Llama and a GPT-2 on KJV verses cut to 16 tokens (every micro-batch padded differently),
// with adapter dropout (per sample: independent of the split) and a module trained whole.
const std::string kKjv =
    "--set data.type=kjv --set data.max_length=16 --set data.train_limit=64 --set data.eval_limit=-1 "
    "--set threads=2 --set learning_rate=1e-2 --set seed=7 --set lora.r=3 --set lora.alpha=5 --set lora.dropout=0.1 ";
const std::string kLlama =
    "--set model.type=llama --set model.n_layer=2 --set model.n_embd=24 --set model.n_head=6 --set model.n_kv_head=2 "
    "--set model.intermediate_size=40 --set model.n_positions=32 "
    "--set lora.target_modules=[q_proj,v_proj,gate_proj,down_proj] --set lora.modules_to_save=[norm] ";
const std::string kGpt2 =
    "--set model.type=gpt2 --set model.n_layer=2 --set model.n_embd=24 --set model.n_head=3 --set model.n_positions=32 "
    "--set lora.target_modules=[c_attn,mlp.c_proj] --set lora.modules_to_save=[ln_f] ";

TEST(LoraCli, VerifyFindsPaddedSplitsExactInFloat64WithAdapters) {
  for (const auto& model : {kLlama, kGpt2}) {
    const auto r = run_cli("verify --splits 16x1,4x4,1x16 --steps 3 --tolerance 1e-10 " + kKjv + model);
    EXPECT_EQ(r.exit_code, 0) << model << ":\n" << r.out << r.err;
    EXPECT_NE(r.out.find("exact: every split follows the full-batch trajectory"), std::string::npos) << r.out;
  }
}

// The trained tensors of kLlama at rank 3, in float64: 2 layers × (q: 3·24 + 24·3, v: 3·24 + 8·3,
// gate: 3·24 + 40·3, down: 3·40 + 24·3) + the norm's 24.
constexpr int64_t kLlamaTrained = 2 * (144 + 96 + 192 + 192) + 24;

TEST(LoraCli, TwoRanksEqualOneProcessWithAndWithoutZero1Or3AndReduceOnlyTheAdaptersBytes) {
  const auto dir = make_temp_dir("lora-dp");
  const std::string run = kKjv + kLlama + "--set dtype=float64 --set max_steps=3 --set per_device_train_batch_size=4 ";
  const auto one = gradaccum::testing::train_steps(run + "--set gradient_accumulation_steps=4", dir + "/one");
  const auto two = gradaccum::testing::train_steps(run + "--set gradient_accumulation_steps=2 --nproc 2", dir + "/two");
  // ZeRO-1 shards the optimizer state of the trained tensors only, and follows the same trajectory.
  const auto zero = gradaccum::testing::train_steps(
      run + "--set gradient_accumulation_steps=2 --nproc 2 --set zero_stage=1", dir + "/zero");
  // ZeRO-3 shards the trained tensors only: each block's adapters are a unit (the first one's input
  // needs no gradient, below the frozen embeddings), the trained norm the root.
  const auto zero3 = gradaccum::testing::train_steps(
      run + "--set gradient_accumulation_steps=2 --nproc 2 --set zero_stage=3 --set sharded_grad_sync=defer",
      dir + "/zero3");
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(zero3.size(), 3u);
  ASSERT_EQ(two.size(), 3u);
  ASSERT_EQ(zero.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_LE(gradaccum::testing::relative_difference(two[i]["loss"], one[i]["loss"]), 1e-10) << i;
    EXPECT_LE(gradaccum::testing::relative_difference(two[i]["grad_norm"], one[i]["grad_norm"]), 1e-10) << i;
    EXPECT_LE(gradaccum::testing::relative_difference(zero[i]["loss"], one[i]["loss"]), 1e-10) << i;
    EXPECT_LE(gradaccum::testing::relative_difference(zero[i]["grad_norm"], one[i]["grad_norm"]), 1e-10) << i;
    EXPECT_EQ(two[i]["allreduce_bytes"].get<int64_t>(), kLlamaTrained * 8) << i;
    EXPECT_EQ(two[i]["allreduce_calls"].get<int64_t>(), 1) << i;
    EXPECT_LE(gradaccum::testing::relative_difference(zero3[i]["loss"], one[i]["loss"]), 1e-10) << i;
    EXPECT_LE(gradaccum::testing::relative_difference(zero3[i]["grad_norm"], one[i]["grad_norm"]), 1e-10) << i;
    EXPECT_LE(gradaccum::testing::relative_difference(zero3[i]["weight_norm"], one[i]["weight_norm"]), 1e-10) << i;
    EXPECT_EQ(zero3[i]["reduce_scatter_bytes"].get<int64_t>(), kLlamaTrained * 8) << i;  // W ranges, no padding
    EXPECT_EQ(zero3[i]["reduce_scatter_calls"].get<int64_t>(), 3) << i;                  // two blocks, the root
  }
  fs::remove_all(dir);
}

TEST(LoraCli, ARunWritesPeftsFilesThatEvalAndExportRead) {
  const auto dir = make_temp_dir("lora-run");
  // The base: a fresh tiny Llama written as an HF checkpoint.
  models::ModelConfig llama;
  llama.n_layer = 2, llama.n_embd = 24, llama.n_head = 6, llama.n_kv_head = 2, llama.intermediate_size = 40;
  llama.n_positions = 32;
  auto base = models::make_language_model("llama", llama, 50257, 0, 11);
  models::write_hf_checkpoint(dir + "/base", {base.hf_config, base.weights()});
  const std::string run = kKjv + kLlama + "--set model.hf_checkpoint=" + dir +
                          "/base --set max_steps=4 --set save_steps=2 --set per_device_train_batch_size=4 "
                          "--set gradient_accumulation_steps=2";
  const auto steps = gradaccum::testing::train_steps(run, dir + "/run");
  ASSERT_EQ(steps.size(), 4u);
  for (const auto* sub : {"/run/final", "/run/checkpoints/step-2"}) {
    const std::string d = dir + sub;
    EXPECT_TRUE(fs::exists(d + "/adapter_config.json")) << d;
    EXPECT_FALSE(fs::exists(d + "/model.safetensors")) << d;
    EXPECT_FALSE(fs::exists(d + "/config.json")) << d;
    const auto config = nlohmann::json::parse(gradaccum::testing::read_text(d + "/adapter_config.json"));
    EXPECT_EQ(config["peft_type"], "LORA");
    EXPECT_EQ(config["task_type"], "CAUSAL_LM");
    EXPECT_EQ(config["r"], 3);
    EXPECT_EQ(config["lora_alpha"], 5.0);
    EXPECT_EQ(config["target_modules"], nlohmann::json({"q_proj", "v_proj", "gate_proj", "down_proj"}));
    EXPECT_EQ(config["modules_to_save"], nlohmann::json({"norm"}));
    EXPECT_EQ(config["base_model_name_or_path"], fs::absolute(dir + "/base").lexically_normal().string());
    const auto adapter = formats::load_safetensors(d + "/adapter_model.safetensors");
    int64_t numel = 0;
    for (const auto& [name, tensor] : adapter) {
      EXPECT_EQ(name.rfind("base_model.model.model.", 0), 0u) << name;
      numel += tensor.numel();
    }
    EXPECT_EQ(adapter.size(), 17u);  // 8 adapters × (A, B) and the norm
    EXPECT_EQ(numel, kLlamaTrained);
  }
  // The checkpoint's optimizer state: the adapters' and the norm's, under their module names.
  const auto optimizer = formats::load_safetensors(dir + "/run/checkpoints/step-2/optimizer.safetensors");
  EXPECT_EQ(optimizer.size(), 3u * 17u);
  for (const auto& [name, tensor] : optimizer) {
    EXPECT_TRUE(name.find(".lora_") != std::string::npos || name.rfind("transformer.norm.weight.", 0) == 0) << name;
  }
  // eval on the adapter (the base from base_model_name_or_path) equals eval on its merged export.
  const std::string text = dir + "/eval.txt";
  std::ofstream(text) << "And God said, Let there be light: and there was light.\nIn the beginning God created the "
                         "heaven and the earth.\n";
  const auto adapted = run_cli("eval --checkpoint " + dir + "/run/final " + text);
  ASSERT_EQ(adapted.exit_code, 0) << adapted.err;
  const auto exported = run_cli("export --merge-lora " + dir + "/run/final " + dir + "/merged");
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_TRUE(fs::exists(dir + "/merged/gpt2.tiktoken") || fs::exists(dir + "/merged/tokenizer.json"));
  const auto merged = run_cli("eval --checkpoint " + dir + "/merged " + text);
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  const auto a = nlohmann::json::parse(adapted.out), m = nlohmann::json::parse(merged.out);
  EXPECT_EQ(a["tokens"], m["tokens"]);
  EXPECT_LE(gradaccum::testing::relative_difference(m["loss"], a["loss"]), 1e-5);
  const auto plain = run_cli("eval --checkpoint " + dir + "/base --tokenizer " +
                             gradaccum::testing::gpt2_tokenizer_dir() + " " + text);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_GT(gradaccum::testing::relative_difference(nlohmann::json::parse(plain.out)["loss"], a["loss"]), 1e-4);
  // Resuming the saved checkpoint in a fresh output_dir continues the run exactly.
  const auto resumed = gradaccum::testing::train_steps(
      run + " --set resume_from_checkpoint=" + dir + "/run/checkpoints/step-2", dir + "/resumed");
  ASSERT_EQ(resumed.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(resumed[i]["loss"], steps[2 + i]["loss"]) << i;
    EXPECT_EQ(resumed[i]["grad_norm"], steps[2 + i]["grad_norm"]) << i;
  }
  EXPECT_EQ(gradaccum::testing::read_text(dir + "/resumed/final/adapter_model.safetensors"),
            gradaccum::testing::read_text(dir + "/run/final/adapter_model.safetensors"));
  fs::remove_all(dir);
}

}  // namespace lora_test
