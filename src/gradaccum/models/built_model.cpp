#include "gradaccum/models/built_model.h"

#include "gradaccum/base/check.h"
#include "gradaccum/models/bloom.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/models/hf_checkpoint.h"
#include "gradaccum/models/module_tensors.h"
#include "gradaccum/models/sequence_classifier.h"

namespace gradaccum::models {

namespace {

// The backbone, the head and the HF config for one architecture.
BuiltModel assemble(const std::string& architecture, const Gpt2Config* gpt2, const BloomConfig* bloom,
                    int64_t num_labels, uint64_t init_seed) {
  BuiltModel built;
  built.architecture = architecture;
  built.num_labels = num_labels;
  Decoder decoder{nullptr};
  double initializer_range = 0.02;
  if (gpt2 != nullptr) {
    built.hf_config = gpt2_hf_config(*gpt2, num_labels);
    initializer_range = gpt2->initializer_range;
    if (num_labels == 0) {
      built.task = std::make_unique<CausalLm>(Gpt2LmHeadModel(*gpt2));
    } else {
      decoder = as_decoder(Gpt2Model(*gpt2));
    }
  } else {
    built.hf_config = bloom_hf_config(*bloom, num_labels);
    initializer_range = bloom->initializer_range;
    if (num_labels == 0) {
      built.task = std::make_unique<CausalLm>(BloomForCausalLm(*bloom));
    } else {
      decoder = as_decoder(BloomModel(*bloom));
    }
  }
  if (num_labels > 0) {
    built.task = std::make_unique<SequenceClassifier>(
        SequenceClassificationModel(decoder, num_labels, initializer_range, init_seed));
  }
  built.backbone = num_labels == 0 ? static_cast<CausalLm&>(*built.task).model()->transformer
                                   : static_cast<SequenceClassifier&>(*built.task).model()->transformer;
  built.max_positions = built.backbone->max_positions();
  built.vocab_size = built.backbone->vocab_size();
  return built;
}

// One dropout key of an architecture: its name, the value the configuration gives (-1: none),
// and the model config's field it sets.
struct DropoutKey {
  const char* name;
  double given;
  double* field;
};

// The model.<name> dropout keys over a config's own values (-1: keep them), each checked. A key of
// another architecture (or the cnn's model.dropout) is an error naming this one's keys, so that a
// misspelt intent does not pass silently.
void apply_dropout_keys(const ModelConfig& config, const char* model, std::initializer_list<DropoutKey> own,
                        const char* other_model, std::initializer_list<std::pair<const char*, double>> other) {
  std::string names;
  for (size_t i = 0; i < own.size(); ++i) {
    names += (i == 0 ? "" : i + 1 == own.size() ? " and " : ", ") + std::string(own.begin()[i].name);
  }
  for (const auto& [key, value] : other) {
    GA_CHECK(value == -1, "key 'model.{}': a {} setting; {}'s dropouts are {}", key, other_model, model, names);
  }
  GA_CHECK(config.dropout == 0.0, "key 'model.dropout': the cnn's; {}'s dropouts are {}", model, names);
  for (const auto& key : own) {
    if (key.given != -1) *key.field = key.given;
    check_dropout_probability(fmt::format("model.{}", key.name), *key.field);
  }
}

void apply_dropout(const ModelConfig& config, Gpt2Config& c) {
  apply_dropout_keys(config, "GPT-2",
                     {{"resid_pdrop", config.resid_pdrop, &c.resid_pdrop},
                      {"embd_pdrop", config.embd_pdrop, &c.embd_pdrop},
                      {"attn_pdrop", config.attn_pdrop, &c.attn_pdrop}},
                     "BLOOM",
                     {{"hidden_dropout", config.hidden_dropout}, {"attention_dropout", config.attention_dropout}});
  c.dropout_rng = config.dropout_rng;
}

void apply_dropout(const ModelConfig& config, BloomConfig& c) {
  apply_dropout_keys(
      config, "BLOOM",
      {{"hidden_dropout", config.hidden_dropout, &c.hidden_dropout},
       {"attention_dropout", config.attention_dropout, &c.attention_dropout}},
      "GPT-2",
      {{"resid_pdrop", config.resid_pdrop}, {"embd_pdrop", config.embd_pdrop}, {"attn_pdrop", config.attn_pdrop}});
  c.dropout_rng = config.dropout_rng;
}

}  // namespace

WeightList BuiltModel::weights() {
  return is_language_model() ? hf_tensors(task->module(), architecture) : module_tensors(task->module());
}

void BuiltModel::load_weights(const WeightList& weights, const std::string& what,
                              const std::vector<std::string>& may_be_missing) {
  if (is_language_model()) {
    load_hf_tensors(task->module(), weights, architecture, what, may_be_missing);
  } else {
    load_module_tensors(task->module(), weights, what);
  }
}

CausalLmHeadImpl* BuiltModel::causal_lm() {
  auto* lm = dynamic_cast<CausalLm*>(task.get());
  return lm != nullptr ? lm->model().get() : nullptr;
}

void BuiltModel::set_gradient_checkpointing(bool enabled) {
  if (!enabled && backbone.is_empty()) return;
  GA_CHECK(!backbone.is_empty(),
           "key 'gradient_checkpointing': only GPT-2 and BLOOM models have transformer blocks to checkpoint");
  backbone->set_gradient_checkpointing(enabled);
}

void BuiltModel::set_loss_chunk_tokens(int64_t tokens) {
  if (tokens == 0 && causal_lm() == nullptr) return;
  auto* lm = dynamic_cast<CausalLm*>(task.get());
  GA_CHECK(lm != nullptr, "key 'loss_chunk_tokens': only causal language models have an LM head to chunk");
  lm->set_loss_chunk_tokens(tokens);
}

namespace {

// The vocabulary of a fresh language model, after the checks both architectures share.
int64_t checked_language_config(const ModelConfig& config, int64_t vocab_size) {
  GA_CHECK(config.n_layer >= 1 && config.n_embd >= 1 && config.n_head >= 1,
           "model: n_layer, n_embd and n_head must be >= 1");
  GA_CHECK(config.n_embd % config.n_head == 0, "model: n_embd {} is not a multiple of n_head {}", config.n_embd,
           config.n_head);
  const int64_t vocab = config.vocab_size > 0 ? config.vocab_size : vocab_size;
  GA_CHECK(vocab >= vocab_size, "key 'model.vocab_size': {} is smaller than the tokenizer's {} ids", vocab, vocab_size);
  return vocab;
}

}  // namespace

BuiltModel make_gpt2(const ModelConfig& config, int64_t vocab_size, int64_t num_labels, uint64_t init_seed) {
  const int64_t vocab = checked_language_config(config, vocab_size);
  GA_CHECK(config.n_positions >= 2, "key 'model.n_positions': must be >= 2, got {}", config.n_positions);
  Gpt2Config c;
  c.vocab_size = vocab;
  c.n_positions = config.n_positions;
  c.n_embd = config.n_embd;
  c.n_layer = config.n_layer;
  c.n_head = config.n_head;
  c.init_seed = init_seed;
  apply_dropout(config, c);
  return assemble("gpt2", &c, nullptr, num_labels, init_seed);
}

BuiltModel make_bloom(const ModelConfig& config, int64_t vocab_size, int64_t num_labels, uint64_t init_seed) {
  const int64_t vocab = checked_language_config(config, vocab_size);
  BloomConfig c;
  c.vocab_size = vocab;
  c.hidden_size = config.n_embd;
  c.n_layer = config.n_layer;
  c.n_head = config.n_head;
  c.init_seed = init_seed;
  apply_dropout(config, c);
  return assemble("bloom", nullptr, &c, num_labels, init_seed);
}

BuiltModel load_language_model(const std::string& dir, int64_t num_labels, uint64_t init_seed,
                               const ModelConfig* config) {
  auto checkpoint = read_hf_checkpoint(dir);
  const auto what = dir + "/config.json";
  const auto type = hf_model_type(checkpoint.config, what);
  const int64_t saved_labels = hf_num_labels(checkpoint.config, what);
  const int64_t labels = num_labels < 0 ? saved_labels : num_labels;
  BuiltModel built;
  if (type == "gpt2") {
    auto c = gpt2_config_from_hf(checkpoint.config, what);
    if (config != nullptr) apply_dropout(*config, c);
    built = assemble("gpt2", &c, nullptr, labels, init_seed);
  } else {
    auto c = bloom_config_from_hf(checkpoint.config, what);
    if (config != nullptr) apply_dropout(*config, c);
    built = assemble("bloom", nullptr, &c, labels, init_seed);
  }
  // A causal-LM checkpoint fine-tuned as a classifier starts its head fresh;
  // a classifier's head is never silently dropped or resized.
  GA_CHECK(saved_labels == 0 || saved_labels == labels, "{}: the checkpoint classifies {} labels, the task has {}",
           what, saved_labels, labels);
  std::vector<std::string> fresh;
  if (saved_labels == 0 && labels > 0) fresh.push_back("score.weight");
  built.load_weights(checkpoint.tensors, dir + "/model.safetensors", fresh);
  return built;
}

}  // namespace gradaccum::models
