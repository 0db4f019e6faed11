// Hugging Face checkpoints: GPT-2 save → load round trips (bit-identical
// logits), a golden checkpoint written in HF's own layout by an independent
// Python implementation (tests/fixtures/gen_hf_gpt2_golden.py), the name-mapping
// rules (Conv1D transposes, tied heads, missing `transformer.` prefix, ignored
// buffers), config conversion, and the errors on bad input.
#include "gradaccum/models/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "gradaccum/base/check.h"
#include "gradaccum/models/bloom.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/models/sequence_classifier.h"
#include "test_support.h"

namespace hf_checkpoint_test {

namespace fs = std::filesystem;
using gradaccum::Error;
using gradaccum::models::as_decoder;
using gradaccum::models::bloom_config_from_hf;
using gradaccum::models::bloom_hf_config;
using gradaccum::models::BloomBlockImpl;
using gradaccum::models::BloomConfig;
using gradaccum::models::BloomForCausalLm;
using gradaccum::models::gpt2_config_from_hf;
using gradaccum::models::gpt2_hf_config;
using gradaccum::models::Gpt2Config;
using gradaccum::models::Gpt2LmHeadModel;
using gradaccum::models::Gpt2Model;
using gradaccum::models::hf_model_type;
using gradaccum::models::hf_num_labels;
using gradaccum::models::hf_tensors;
using gradaccum::models::HfCheckpoint;
using gradaccum::models::load_hf_tensors;
using gradaccum::models::read_hf_checkpoint;
using gradaccum::models::SequenceClassificationModel;
using gradaccum::models::write_hf_checkpoint;
using gradaccum::testing::make_temp_dir;
using gradaccum::testing::max_relative_difference;
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

const std::string kGolden = std::string(GRADACCUM_TEST_DATA) + "/hf_gpt2";

using gradaccum::testing::error_of;

Gpt2Config tiny_config(uint64_t seed) {
  Gpt2Config c;
  c.vocab_size = 64;
  c.n_positions = 16;
  c.n_embd = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.init_seed = seed;
  return c;
}

torch::Tensor sample_ids() {
  return torch::tensor({3, 14, 15, 9, 26, 53, 58, 9, 7, 9, 32, 38}, torch::kLong).view({2, 6});
}

torch::Tensor find(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  return {};
}

NamedTensors without(NamedTensors tensors, const std::string& name) {
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(), [&](const auto& item) { return item.first == name; }),
                tensors.end());
  return tensors;
}

NamedTensors replaced(NamedTensors tensors, const std::string& name, torch::Tensor value) {
  for (auto& item : tensors)
    if (item.first == name) item.second = value;
  return tensors;
}

// --- GPT-2 round trip ------------------------------------------------------------

TEST(HfCheckpoint, Gpt2SaveThenLoadGivesBitIdenticalLogits) {
  Gpt2LmHeadModel saved(tiny_config(1));
  const auto dir = make_temp_dir("hf-roundtrip") + "/ckpt";
  write_hf_checkpoint(dir, {gpt2_hf_config(saved->config()), hf_tensors(*saved, "gpt2")});
  EXPECT_TRUE(fs::exists(dir + "/config.json"));
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));

  const HfCheckpoint checkpoint = read_hf_checkpoint(dir);
  const Gpt2Config config = gpt2_config_from_hf(checkpoint.config, dir);
  EXPECT_EQ(config.vocab_size, 64);
  EXPECT_EQ(config.n_positions, 16);
  EXPECT_EQ(config.n_embd, 16);
  EXPECT_EQ(config.n_layer, 2);
  EXPECT_EQ(config.n_head, 2);
  EXPECT_EQ(config.layer_norm_epsilon, 1e-5);

  Gpt2LmHeadModel loaded(tiny_config(2));
  const auto ids = sample_ids();
  const auto expected = saved->forward(ids);
  ASSERT_FALSE(torch::equal(loaded->forward(ids), expected));  // the seeds differ
  load_hf_tensors(*loaded, checkpoint.tensors, "gpt2", dir);
  EXPECT_TRUE(torch::equal(loaded->forward(ids), expected));
}

TEST(HfCheckpoint, Gpt2TensorsUseHfNamesAndConv1DLayout) {
  Gpt2LmHeadModel model(tiny_config(1));
  const auto tensors = hf_tensors(*model, "gpt2");
  EXPECT_EQ(tensors.size(), model->parameters().size());
  EXPECT_FALSE(find(tensors, "lm_head.weight").defined());  // tied: dropped as HF does
  const auto& block = model->gpt2()->h[0]->as<gradaccum::models::Gpt2BlockImpl>();
  const std::map<std::string, torch::Tensor> transposed = {
      {"transformer.h.0.attn.c_attn.weight", block->attn->c_attn->weight},
      {"transformer.h.0.attn.c_proj.weight", block->attn->c_proj->weight},
      {"transformer.h.0.mlp.c_fc.weight", block->mlp->c_fc->weight},
      {"transformer.h.0.mlp.c_proj.weight", block->mlp->c_proj->weight}};
  for (const auto& [name, ours] : transposed) {
    const auto theirs = find(tensors, name);
    ASSERT_TRUE(theirs.defined()) << name;
    EXPECT_TRUE(torch::equal(theirs, ours.t())) << name;
  }
  EXPECT_EQ(find(tensors, "transformer.h.0.attn.c_attn.weight").sizes(), torch::IntArrayRef({16, 48}));  // [in, out]
  EXPECT_TRUE(torch::equal(find(tensors, "transformer.wte.weight"), model->gpt2()->wte->weight));
  // A snapshot: later training does not change it.
  {
    torch::NoGradGuard no_grad;
    model->gpt2()->wte->weight.add_(1.0);
  }
  EXPECT_FALSE(torch::equal(find(tensors, "transformer.wte.weight"), model->gpt2()->wte->weight));
}

TEST(HfCheckpoint, WritingReplacesAnExistingDirectoryAndLeavesNoStaging) {
  const auto parent = make_temp_dir("hf-replace");
  const auto dir = parent + "/ckpt";
  Gpt2LmHeadModel first(tiny_config(1)), second(tiny_config(2));
  write_hf_checkpoint(dir, {gpt2_hf_config(first->config()), hf_tensors(*first, "gpt2")});
  std::ofstream(dir + "/stale.txt") << "from the first save";
  write_hf_checkpoint(dir + "/", {gpt2_hf_config(second->config()), hf_tensors(*second, "gpt2")});
  EXPECT_FALSE(fs::exists(dir + "/stale.txt"));
  const auto back = read_hf_checkpoint(dir);
  EXPECT_TRUE(torch::equal(find(back.tensors, "transformer.wte.weight"), second->gpt2()->wte->weight));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(parent)) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"ckpt"});
}

// --- Golden checkpoint from an independent implementation ----------------------------

struct Golden {
  torch::Tensor input_ids, attention_mask, logits;  // logits [B, T, V] float64
};

Golden read_golden() {
  std::ifstream in(kGolden + "/golden.json");
  const auto j = nlohmann::json::parse(in);
  Golden g;
  auto rows = j["input_ids"].get<std::vector<std::vector<int64_t>>>();
  auto mask = j["attention_mask"].get<std::vector<std::vector<int64_t>>>();
  const int64_t batch = static_cast<int64_t>(rows.size()), time = static_cast<int64_t>(rows[0].size());
  g.input_ids = torch::empty({batch, time}, torch::kLong);
  g.attention_mask = torch::empty({batch, time}, torch::kLong);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < time; ++t) {
      g.input_ids[b][t] = rows[b][t];
      g.attention_mask[b][t] = mask[b][t];
    }
  g.logits = torch::tensor(j["logits"].get<std::vector<double>>(), torch::kDouble).view({batch, time, -1});
  return g;
}

// Max |Δ| / max |golden| over the real (unpadded) positions.
double golden_difference(const torch::Tensor& logits, const Golden& g) {
  const auto real = g.attention_mask.to(torch::kBool);
  return max_relative_difference(logits.to(torch::kDouble).index({real}), g.logits.index({real}));
}

TEST(HfCheckpoint, GoldenGpt2FromAnIndependentImplementationMatches) {
  const auto checkpoint = read_hf_checkpoint(kGolden);
  EXPECT_EQ(hf_model_type(checkpoint.config, kGolden), "gpt2");
  EXPECT_EQ(hf_num_labels(checkpoint.config, kGolden), 0);
  const auto config = gpt2_config_from_hf(checkpoint.config, kGolden);
  const Golden golden = read_golden();

  // The golden logits are inference's; the checkpoint's config has HF's dropout of 0.1.
  EXPECT_EQ(config.resid_pdrop, 0.1);
  Gpt2LmHeadModel model(config);
  model->eval();
  ASSERT_GT(golden_difference(model->forward(golden.input_ids, golden.attention_mask), golden), 0.1);
  load_hf_tensors(*model, checkpoint.tensors, "gpt2", kGolden);
  torch::NoGradGuard no_grad;
  EXPECT_LE(golden_difference(model->forward(golden.input_ids, golden.attention_mask), golden), 1e-5);

  // Loaded into a float64 model (F32 → F64 on load) it matches to float64 precision:
  // the remaining float32 difference above is rounding, not a mapping error.
  Gpt2LmHeadModel model64(config);
  model64->eval();
  model64->to(torch::kDouble);
  load_hf_tensors(*model64, checkpoint.tensors, "gpt2", kGolden);
  EXPECT_EQ(model64->gpt2()->wte->weight.scalar_type(), torch::kDouble);
  EXPECT_LE(golden_difference(model64->forward(golden.input_ids, golden.attention_mask), golden), 1e-12);
}

TEST(HfCheckpoint, AcceptsNamesWithoutTransformerPrefixAndAPresentTiedHead) {
  const auto checkpoint = read_hf_checkpoint(kGolden);
  const auto config = gpt2_config_from_hf(checkpoint.config, kGolden);
  const Golden golden = read_golden();
  // OpenAI's original gpt2 files: "h.0.attn.c_attn.weight", "wte.weight", and the
  // attn.bias / attn.masked_bias buffers (the golden file carries those too).
  NamedTensors bare;
  for (const auto& [name, t] : checkpoint.tensors)
    bare.emplace_back(name.substr(std::string("transformer.").size()), t);
  ASSERT_TRUE(find(bare, "h.1.attn.masked_bias").defined());
  bare.emplace_back("lm_head.weight", find(bare, "wte.weight"));

  Gpt2LmHeadModel model(config);
  model->eval();  // inference logits, as the golden's
  load_hf_tensors(*model, bare, "gpt2", "bare");
  torch::NoGradGuard no_grad;
  EXPECT_LE(golden_difference(model->forward(golden.input_ids, golden.attention_mask), golden), 1e-5);

  EXPECT_ONE_LINE_ERROR(
      load_hf_tensors(*model, replaced(bare, "lm_head.weight", torch::zeros({63, 16})), "gpt2", "bare"),
      "bare: tensor lm_head.weight: shape [63, 16] does not match the tied transformer.wte.weight "
      "[64, 16]");
}

// --- Load errors --------------------------------------------------------------------

TEST(HfCheckpointErrors, MissingWrongShapeUnexpectedOrDuplicateTensorIsNamed) {
  Gpt2LmHeadModel source(tiny_config(1));
  const auto tensors = hf_tensors(*source, "gpt2");
  Gpt2LmHeadModel model(tiny_config(2));
  const auto before = gradaccum::testing::flat_params(*model);

  EXPECT_ONE_LINE_ERROR(load_hf_tensors(*model, without(tensors, "transformer.h.1.ln_2.bias"), "gpt2", "ck"),
                        "ck: missing tensor transformer.h.1.ln_2.bias");
  EXPECT_ONE_LINE_ERROR(
      load_hf_tensors(*model, without(without(tensors, "transformer.ln_f.bias"), "transformer.wpe.weight"), "gpt2",
                      "ck"),
      "ck: missing tensor transformer.wpe.weight (and 1 more)");
  EXPECT_ONE_LINE_ERROR(
      load_hf_tensors(*model, replaced(tensors, "transformer.ln_f.weight", torch::ones({17})), "gpt2", "ck"),
      "ck: tensor transformer.ln_f.weight: shape [17] does not match the model's [16]");
  // Our own [out, in] layout where HF's Conv1D [in, out] is expected.
  EXPECT_ONE_LINE_ERROR(
      load_hf_tensors(*model, replaced(tensors, "transformer.h.0.attn.c_attn.weight", torch::zeros({48, 16})), "gpt2",
                      "ck"),
      "ck: tensor transformer.h.0.attn.c_attn.weight: shape [48, 16] does not match the model's "
      "[16, 48] (HF Conv1D layout [in, out])");
  auto extra = tensors;
  extra.emplace_back("transformer.h.0.attn.rotary.weight", torch::zeros({2}));
  EXPECT_ONE_LINE_ERROR(load_hf_tensors(*model, extra, "gpt2", "ck"),
                        "ck: unexpected tensor transformer.h.0.attn.rotary.weight");
  auto twice = tensors;
  twice.emplace_back("wte.weight", find(tensors, "transformer.wte.weight"));
  EXPECT_ONE_LINE_ERROR(load_hf_tensors(*model, twice, "gpt2", "ck"), "both hold parameter transformer.wte.weight");
  EXPECT_ONE_LINE_ERROR(
      load_hf_tensors(*model, replaced(tensors, "transformer.ln_f.bias", torch::zeros({16}, torch::kLong)), "gpt2",
                      "ck"),
      "ck: tensor transformer.ln_f.bias: dtype Long is not floating point");
  EXPECT_ONE_LINE_ERROR(load_hf_tensors(*model, tensors, "opt", "ck"),
                        "unknown architecture \"opt\" (expected one of gpt2, bloom, llama, qwen2, qwen3, mistral)");

  // Every failure above was detected before anything was copied.
  EXPECT_TRUE(torch::equal(gradaccum::testing::flat_params(*model), before));
}

// --- Heads and ties beyond GPT2LMHeadModel ---------------------------------------------

SequenceClassificationModel gpt2_classifier(const Gpt2Config& config, int64_t labels) {
  return SequenceClassificationModel(as_decoder(Gpt2Model(config)), labels, 0.02, config.init_seed);
}

TEST(HfCheckpoint, SequenceClassifierScoreHeadAndFineTuningFromAnLmCheckpoint) {
  const auto config = tiny_config(3);
  auto classifier = gpt2_classifier(config, 3);
  const auto tensors = hf_tensors(*classifier, "gpt2");
  ASSERT_TRUE(find(tensors, "score.weight").defined());
  EXPECT_EQ(find(tensors, "score.weight").sizes(), torch::IntArrayRef({3, 16}));  // no transpose

  const auto hf_config = gpt2_hf_config(config, 3);
  EXPECT_EQ(hf_config["architectures"], nlohmann::json::array({"GPT2ForSequenceClassification"}));
  EXPECT_EQ(hf_config["id2label"], nlohmann::json({{"0", "LABEL_0"}, {"1", "LABEL_1"}, {"2", "LABEL_2"}}));
  EXPECT_EQ(hf_config["label2id"]["LABEL_2"], 2);
  EXPECT_EQ(hf_num_labels(hf_config, "c"), 3);

  auto other = gpt2_classifier(tiny_config(4), 3);
  load_hf_tensors(*other, tensors, "gpt2", "cls");
  EXPECT_TRUE(torch::equal(gradaccum::testing::flat_params(*other), gradaccum::testing::flat_params(*classifier)));

  // From a causal-LM checkpoint the score head is missing: an error unless allowed,
  // in which case it keeps its initialization.
  const auto lm = read_hf_checkpoint(kGolden);
  EXPECT_ONE_LINE_ERROR(load_hf_tensors(*other, lm.tensors, "gpt2", "lm"), "lm: missing tensor score.weight");
  const auto score_before = other->score->weight.clone();
  load_hf_tensors(*other, lm.tensors, "gpt2", "lm", {"score.weight"});
  EXPECT_TRUE(torch::equal(other->score->weight, score_before));
  EXPECT_TRUE(torch::equal(other->transformer->token_embedding(), find(lm.tensors, "transformer.wte.weight")));
}

BloomConfig tiny_bloom(uint64_t seed) {
  BloomConfig c;
  c.vocab_size = 32;
  c.hidden_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.init_seed = seed;
  return c;
}

TEST(HfCheckpoint, BloomSaveThenLoadNoTransposeAndBareNames) {
  BloomForCausalLm saved(tiny_bloom(1));
  const auto dir = make_temp_dir("hf-bloom") + "/ckpt";
  write_hf_checkpoint(dir, {bloom_hf_config(saved->config()), hf_tensors(*saved, "bloom")});
  const auto checkpoint = read_hf_checkpoint(dir);
  EXPECT_EQ(hf_model_type(checkpoint.config, dir), "bloom");
  EXPECT_EQ(checkpoint.config["architectures"], nlohmann::json::array({"BloomForCausalLM"}));
  const auto config = bloom_config_from_hf(checkpoint.config, dir);
  EXPECT_EQ(config.vocab_size, 32);
  EXPECT_EQ(config.hidden_size, 8);
  EXPECT_EQ(config.n_layer, 2);
  EXPECT_EQ(config.n_head, 2);
  EXPECT_FALSE(find(checkpoint.tensors, "lm_head.weight").defined());
  const auto qkv = find(checkpoint.tensors, "transformer.h.0.self_attention.query_key_value.weight");
  ASSERT_TRUE(qkv.defined());
  EXPECT_TRUE(torch::equal(qkv, saved->bloom()->h[0]->as<BloomBlockImpl>()->self_attention->query_key_value->weight));

  const auto ids = sample_ids().remainder(32);
  BloomForCausalLm loaded(tiny_bloom(2));
  ASSERT_FALSE(torch::equal(loaded->forward(ids), saved->forward(ids)));
  load_hf_tensors(*loaded, checkpoint.tensors, "bloom", dir);
  EXPECT_TRUE(torch::equal(loaded->forward(ids), saved->forward(ids)));

  // BLOOM's published files come from BloomModel: no `transformer.` prefix; a
  // tied head written anyway is accepted.
  NamedTensors bare;
  for (const auto& [name, t] : checkpoint.tensors)
    bare.emplace_back(name.substr(std::string("transformer.").size()), t);
  bare.emplace_back("lm_head.weight", find(bare, "word_embeddings.weight"));
  BloomForCausalLm from_bare(tiny_bloom(3));
  load_hf_tensors(*from_bare, bare, "bloom", "bare");
  EXPECT_TRUE(torch::equal(from_bare->forward(ids), saved->forward(ids)));
  // GPT-2's ignored buffers are not BLOOM's.
  bare.emplace_back("h.0.attn.bias", torch::zeros({1}));
  EXPECT_ONE_LINE_ERROR(load_hf_tensors(*from_bare, bare, "bloom", "bare"), "bare: unexpected tensor h.0.attn.bias");
  EXPECT_ONE_LINE_ERROR(
      load_hf_tensors(*from_bare, without(checkpoint.tensors, "transformer.word_embeddings_layernorm.bias"), "bloom",
                      "b"),
      "b: missing tensor transformer.word_embeddings_layernorm.bias");
}

// A head registered as a second name of the embedding's tensor (instead of
// reusing it functionally): neither written nor required, and still tied after
// loading.
struct TiedToyImpl : torch::nn::Module {
  TiedToyImpl() {
    auto backbone = register_module("transformer", std::make_shared<torch::nn::Module>());
    embedding = backbone->register_module("word_embeddings", torch::nn::Embedding(10, 4));
    auto head = register_module("lm_head", std::make_shared<torch::nn::Module>());
    head_weight = head->register_parameter("weight", embedding->weight);
  }
  torch::nn::Embedding embedding{nullptr};
  torch::Tensor head_weight;
};
TORCH_MODULE(TiedToy);

TEST(HfCheckpoint, AParameterRegisteredTwiceIsWrittenOnce) {
  torch::manual_seed(5);
  TiedToy saved;
  const auto tensors = hf_tensors(*saved, "bloom");
  ASSERT_EQ(tensors.size(), 1u);
  EXPECT_EQ(tensors[0].first, "transformer.word_embeddings.weight");
  TiedToy loaded;
  load_hf_tensors(*loaded, tensors, "bloom", "toy");
  EXPECT_TRUE(torch::equal(loaded->embedding->weight, saved->embedding->weight));
  EXPECT_TRUE(torch::equal(loaded->head_weight, saved->embedding->weight));
  auto with_head = tensors;
  with_head.emplace_back("lm_head.weight", torch::zeros({10, 5}));
  EXPECT_ONE_LINE_ERROR(load_hf_tensors(*loaded, with_head, "bloom", "toy"),
                        "toy: tensor lm_head.weight: shape [10, 5] does not match the tied "
                        "transformer.word_embeddings.weight [10, 4]");
}

TEST(HfCheckpointErrors, BloomConfigMissingWrongOrUnsupportedFields) {
  const auto good = bloom_hf_config(tiny_bloom(0), 2);
  EXPECT_EQ(good["architectures"], nlohmann::json::array({"BloomForSequenceClassification"}));
  EXPECT_EQ(hf_num_labels(good, "b"), 2);
  EXPECT_FALSE(good.contains("bos_token_id"));
  EXPECT_EQ(bloom_hf_config(BloomConfig{})["pad_token_id"], 3);
  // bloom-560m's config.json names: n_embed, num_attention_heads.
  auto old_names = good;
  old_names.erase("hidden_size");
  old_names.erase("n_head");
  old_names["n_embed"] = 1024;
  old_names["num_attention_heads"] = 16;
  const auto c = bloom_config_from_hf(old_names, "b");
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.n_head, 16);
  auto with = [&](const std::string& key, const nlohmann::json& value) {
    auto j = good;
    j[key] = value;
    return j;
  };
  auto missing = good;
  missing.erase("hidden_size");
  EXPECT_ONE_LINE_ERROR(bloom_config_from_hf(missing, "b"), "b: config.json has no \"hidden_size\"");
  EXPECT_ONE_LINE_ERROR(bloom_config_from_hf(with("n_layer", 2.5), "b"), "\"n_layer\" must be an integer, got 2.5");
  EXPECT_ONE_LINE_ERROR(bloom_config_from_hf(with("n_head", 3), "b"),
                        "\"hidden_size\" 8 is not divisible by \"n_head\" 3");
  EXPECT_ONE_LINE_ERROR(bloom_config_from_hf(with("apply_residual_connection_post_layernorm", true), "b"),
                        "\"apply_residual_connection_post_layernorm\" is true; this model supports only false");
  EXPECT_ONE_LINE_ERROR(bloom_config_from_hf(with("model_type", "gpt2"), "b"), "not \"bloom\"");
}

// --- Configs --------------------------------------------------------------------------

TEST(HfCheckpoint, Gpt2ConfigHasHfFieldNames) {
  Gpt2Config small;  // GPT-2 small: the 50257-token BPE
  const auto j = gpt2_hf_config(small);
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["n_embd"], 768);
  EXPECT_EQ(j["n_layer"], 12);
  EXPECT_EQ(j["n_head"], 12);
  EXPECT_EQ(j["n_positions"], 1024);
  EXPECT_EQ(j["vocab_size"], 50257);
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["bos_token_id"], 50256);
  EXPECT_EQ(j["eos_token_id"], 50256);
  EXPECT_FALSE(j.contains("id2label"));
  EXPECT_FALSE(gpt2_hf_config(tiny_config(0)).contains("bos_token_id"));
  const auto back = gpt2_config_from_hf(j, "c");
  EXPECT_EQ(back.n_embd, 768);
  EXPECT_EQ(back.initializer_range, 0.02);
}

TEST(HfCheckpointErrors, Gpt2ConfigMissingWrongOrUnsupportedFields) {
  const auto good = gpt2_hf_config(tiny_config(0));
  auto with = [&](const std::string& key, const nlohmann::json& value) {
    auto j = good;
    j[key] = value;
    return j;
  };
  auto drop = [&](const std::string& key) {
    auto j = good;
    j.erase(key);
    return j;
  };
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(drop("n_embd"), "d"), "d: config.json has no \"n_embd\"");
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(with("n_layer", "2"), "d"),
                        "d: config.json \"n_layer\" must be an integer, got \"2\"");
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(with("n_head", 0), "d"), "\"n_head\" must be positive, got 0");
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(with("n_head", 3), "d"), "\"n_embd\" 16 is not divisible by \"n_head\" 3");
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(with("layer_norm_epsilon", "tiny"), "d"),
                        "\"layer_norm_epsilon\" must be a number");
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(drop("model_type"), "d"), "d: config.json has no \"model_type\"");
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(with("model_type", "opt"), "d"),
                        "\"model_type\" is \"opt\"; supported: gpt2, bloom, llama, qwen2, qwen3, mistral");
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(with("model_type", "bloom"), "d"), "not \"gpt2\"");
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(with("activation_function", "relu"), "d"),
                        "\"activation_function\" is \"relu\"");
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(with("n_inner", 10), "d"), "\"n_inner\" is 10");
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(with("tie_word_embeddings", "no"), "d"),
                        "\"tie_word_embeddings\" must be true or false, got \"no\"");
  EXPECT_FALSE(gpt2_config_from_hf(with("tie_word_embeddings", false), "d").tie_word_embeddings);
  EXPECT_TRUE(gpt2_config_from_hf(drop("tie_word_embeddings"), "d").tie_word_embeddings);
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(with("add_cross_attention", true), "d"), "\"add_cross_attention\" is true");
  EXPECT_ONE_LINE_ERROR(gpt2_config_from_hf(nlohmann::json::array(), "d"), "d: config.json is not a JSON object");
  EXPECT_EQ(gpt2_config_from_hf(with("activation_function", "gelu_pytorch_tanh"), "d").n_embd, 16);
  EXPECT_EQ(gpt2_config_from_hf(with("n_inner", 64), "d").n_embd, 16);
  EXPECT_ONE_LINE_ERROR(hf_num_labels(with("architectures", "GPT2LMHeadModel"), "d"),
                        "\"architectures\" must be a list of one class name");
}

// config.json's sizes are checked against the tensors model.safetensors holds as it is read, before
// a model of the claimed size is built.
TEST(HfCheckpointErrors, ConfigClaimingOtherSizesThanTheTensorsIsNamed) {
  const auto dir = make_temp_dir("hf-claims");
  Gpt2LmHeadModel gpt2(tiny_config(1));
  BloomForCausalLm bloom(tiny_bloom(1));
  auto write = [&](const std::string& name, nlohmann::json config, NamedTensors tensors) {
    write_hf_checkpoint(dir + "/" + name, {std::move(config), std::move(tensors)});
    return dir + "/" + name;
  };
  const auto gpt2_config = gpt2_hf_config(gpt2->config());
  auto with = [](nlohmann::json config, const char* key, const nlohmann::json& value) {
    config[key] = value;
    return config;
  };
  const auto layers = write("layers", with(gpt2_config, "n_layer", 100000), hf_tensors(*gpt2, "gpt2"));
  EXPECT_EQ(
      error_of([&] { read_hf_checkpoint(layers); }),
      layers + "/config.json: \"n_layer\" is 100000, but " + layers + "/model.safetensors holds 2 blocks (h.0 to h.1)");
  const auto vocab = write("vocab", with(gpt2_config, "vocab_size", int64_t{1000000000000}), hf_tensors(*gpt2, "gpt2"));
  EXPECT_EQ(error_of([&] { read_hf_checkpoint(vocab); }),
            vocab + "/config.json: \"vocab_size\" is 1000000000000, but " + vocab +
                "/model.safetensors holds transformer.wte.weight of shape [64, 16]");
  const auto no_embedding =
      write("no-embedding", gpt2_config, without(hf_tensors(*gpt2, "gpt2"), "transformer.wte.weight"));
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(no_embedding),
                        no_embedding + "/model.safetensors: it has no tensor wte.weight (or transformer.wte.weight)");
  const auto bloom_config = bloom_hf_config(bloom->config());
  const auto bloom_layers = write("bloom-layers", with(bloom_config, "n_layer", 3), hf_tensors(*bloom, "bloom"));
  EXPECT_EQ(error_of([&] { read_hf_checkpoint(bloom_layers); }), bloom_layers + "/config.json: \"n_layer\" is 3, but " +
                                                                     bloom_layers +
                                                                     "/model.safetensors holds 2 blocks (h.0 to h.1)");
  const auto bloom_width = write("bloom-width", with(bloom_config, "hidden_size", 4096), hf_tensors(*bloom, "bloom"));
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(bloom_width), "/config.json: \"hidden_size\" is 4096, but ");
  // What they hold, they may claim.
  EXPECT_NO_THROW(read_hf_checkpoint(write("gpt2", gpt2_config, hf_tensors(*gpt2, "gpt2"))));
  EXPECT_NO_THROW(read_hf_checkpoint(write("bloom", bloom_config, hf_tensors(*bloom, "bloom"))));
}

TEST(HfCheckpointErrors, DirectoryFilesMissingOrCorrupt) {
  const auto dir = make_temp_dir("hf-bad");
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir + "/none"), dir + "/none: HF checkpoint directory does not exist");
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir), dir + ": HF checkpoint has no config.json");

  std::ofstream(dir + "/config.json") << "{\"model_type\": \"gpt2\",\n";
  std::ofstream(dir + "/model.safetensors") << "x";
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir), dir + "/config.json: not valid JSON");
  std::ofstream(dir + "/config.json") << "[]";
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir), dir + "/config.json: not a JSON object");
  std::ofstream(dir + "/config.json") << "{}";
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir), dir + "/model.safetensors: not a safetensors file: 1 bytes");

  // A truncated copy of the golden weights.
  const auto golden = gradaccum::testing::read_text(kGolden + "/model.safetensors");
  std::ofstream(dir + "/model.safetensors", std::ios::binary) << golden.substr(0, golden.size() - 100);
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir), "extend past the data region");

  fs::remove(dir + "/model.safetensors");
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir), dir + ": HF checkpoint has no model.safetensors");
  std::ofstream(dir + "/pytorch_model.bin") << "pickle";
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir), dir + ": has only pytorch_model.bin");
  // Shards: the index must name, for every tensor, a shard beside it that holds it.
  const auto index = dir + "/model.safetensors.index.json";
  std::ofstream(index) << "{}";
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir), index + ": has no \"weight_map\" object");
  std::ofstream(index) << R"({"weight_map": {"transformer.wte.weight": "../elsewhere.safetensors"}})";
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir), "names \"../elsewhere.safetensors\", not a file beside the index");
  std::ofstream(index) << R"({"weight_map": {"transformer.wte.weight": "model-1.safetensors"}})";
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir),
                        index + ": shard model-1.safetensors (of tensor transformer.wte.weight) does not exist");
  fs::copy_file(kGolden + "/model.safetensors", dir + "/model-1.safetensors");
  EXPECT_ONE_LINE_ERROR(read_hf_checkpoint(dir), "is not listed in " + index);
  const auto golden_tensors = read_hf_checkpoint(kGolden).tensors;
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& [name, tensor] : golden_tensors) weight_map[name] = "model-1.safetensors";
  weight_map["transformer.extra.weight"] = "model-1.safetensors";
  std::ofstream(index) << nlohmann::json({{"weight_map", weight_map}}).dump();
  EXPECT_ONE_LINE_ERROR(
      read_hf_checkpoint(dir),
      index + ": lists tensor transformer.extra.weight in shard model-1.safetensors, which does not hold it");
  weight_map.erase("transformer.extra.weight");
  std::ofstream(index) << nlohmann::json({{"weight_map", weight_map}}).dump();
  EXPECT_EQ(read_hf_checkpoint(dir).tensors.size(), golden_tensors.size());
}

}  // namespace hf_checkpoint_test
