#include "gradaccum/models/built_model.h"

#include <algorithm>

#include "gradaccum/base/check.h"
#include "gradaccum/models/architectures.h"
#include "gradaccum/models/gguf_checkpoint.h"
#include "gradaccum/models/hf_checkpoint.h"
#include "gradaccum/models/lora.h"
#include "gradaccum/models/module_tensors.h"
#include "gradaccum/models/sequence_classifier.h"

namespace gradaccum::models {

namespace {

// The backbone of `config` with its head and the config.json it writes.
BuiltModel assemble(const DecoderArchitecture& architecture, const nlohmann::json& config, const std::string& what,
                    int64_t num_labels, uint64_t backbone_seed, uint64_t head_seed, DropoutRng dropout_rng) {
  auto backbone = architecture.build(config, what, backbone_seed, dropout_rng);
  BuiltModel built;
  built.architecture = architecture.name;
  built.num_labels = num_labels;
  built.hf_config = hf_config_for_task(architecture, backbone.hf_config, num_labels);
  if (num_labels == 0) {
    built.task = std::make_unique<CausalLm>(CausalLmHead(backbone.decoder, backbone.tie_word_embeddings));
  } else {
    built.task = std::make_unique<SequenceClassifier>(
        SequenceClassificationModel(backbone.decoder, num_labels, backbone.initializer_range, head_seed));
  }
  built.backbone = backbone.decoder;
  built.max_positions = built.backbone->max_positions();
  built.vocab_size = built.backbone->vocab_size();
  return built;
}

// The model.<name> dropout keys and the ModelConfig fields that hold them (-1: not given).
const std::vector<std::pair<const char*, double ModelConfig::*>>& dropout_fields() {
  static const std::vector<std::pair<const char*, double ModelConfig::*>> fields{
      {"resid_pdrop", &ModelConfig::resid_pdrop},
      {"embd_pdrop", &ModelConfig::embd_pdrop},
      {"attn_pdrop", &ModelConfig::attn_pdrop},
      {"hidden_dropout", &ModelConfig::hidden_dropout},
      {"attention_dropout", &ModelConfig::attention_dropout}};
  return fields;
}

std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return out;
}

// The model.<name> dropout keys written over config.json's values (the keys are HF's names). A
// key of another architecture (or the cnn's model.dropout) is an error naming this one's keys,
// so that a misspelt intent does not pass silently.
void apply_dropout_keys(const ModelConfig& config, const DecoderArchitecture& architecture, nlohmann::json& hf) {
  const auto& own = architecture.dropouts;
  for (const auto& [key, field] : dropout_fields()) {
    const double given = config.*field;
    if (given == -1 || std::find(own.begin(), own.end(), key) != own.end()) continue;
    std::vector<std::string> owners;
    for (const auto& a : decoder_architectures()) {
      if (std::find(a.dropouts.begin(), a.dropouts.end(), key) != a.dropouts.end()) owners.push_back(a.display);
    }
    throw Error(fmt::format("key 'model.{}': a {} setting; {}'s dropouts are {}", key, listed(owners),
                            architecture.display, listed(own)));
  }
  GA_CHECK(config.dropout == 0.0, "key 'model.dropout': the cnn's; {}'s dropouts are {}", architecture.display,
           listed(own));
  for (const auto& [key, field] : dropout_fields()) {
    const double given = config.*field;
    if (given == -1) continue;
    check_dropout_probability(fmt::format("model.{}", key), given);
    hf[key] = given;
  }
}

const DecoderArchitecture& architecture_named(const std::string& name) {
  const auto* architecture = find_decoder_architecture(name);
  GA_CHECK(architecture != nullptr, "model.type '{}' is not a language model", name);
  return *architecture;
}

}  // namespace

WeightList BuiltModel::weights() {
  if (lora) return peft_adapter_tensors(*this);
  return is_language_model() ? hf_tensors(task->module(), architecture) : module_tensors(task->module());
}

void BuiltModel::load_weights(const WeightList& weights, const std::string& what,
                              const std::vector<std::string>& may_be_missing) {
  if (lora) {
    load_peft_adapter_tensors(*this, weights, what);
  } else if (is_language_model()) {
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
           "key 'gradient_checkpointing': only decoder language models (GPT-2, BLOOM, the Llama family) have "
           "transformer blocks to checkpoint");
  backbone->set_gradient_checkpointing(enabled);
}

void BuiltModel::set_loss_chunk_tokens(int64_t tokens) {
  if (tokens == 0 && causal_lm() == nullptr) return;
  auto* lm = dynamic_cast<CausalLm*>(task.get());
  GA_CHECK(lm != nullptr, "key 'loss_chunk_tokens': only causal language models have an LM head to chunk");
  lm->set_loss_chunk_tokens(tokens);
}

BuiltModel make_language_model(const std::string& name, const ModelConfig& config, int64_t vocab_size,
                               int64_t num_labels, uint64_t init_seed) {
  const auto& architecture = architecture_named(name);
  auto hf = architecture.fresh_config(config, vocab_size);
  apply_dropout_keys(config, architecture, hf);
  return assemble(architecture, hf, "model", num_labels, init_seed, init_seed, config.dropout_rng);
}

BuiltModel language_model_from_hf_config(const nlohmann::json& config, const std::string& what, int64_t num_labels,
                                         uint64_t init_seed) {
  return assemble(decoder_architecture_of(config, what), config, what, num_labels, init_seed, init_seed,
                  DropoutRng::per_sample);
}

BuiltModel load_language_model(const std::string& dir, int64_t num_labels, uint64_t init_seed,
                               const ModelConfig* config) {
  // A GGUF file arrives as the HF checkpoint it stands for; errors name the file itself.
  const bool gguf = is_gguf_path(dir);
  auto checkpoint = gguf ? read_gguf_checkpoint(dir) : read_hf_checkpoint(dir);
  const auto what = gguf ? dir : dir + "/config.json";
  const auto& architecture = decoder_architecture_of(checkpoint.config, what);
  const int64_t saved_labels = hf_num_labels(checkpoint.config, what);
  const int64_t labels = num_labels < 0 ? saved_labels : num_labels;
  auto hf = checkpoint.config;
  if (config != nullptr) apply_dropout_keys(*config, architecture, hf);
  // The backbone's fresh weights are replaced by the checkpoint's; a fresh score head draws its own.
  auto built = assemble(architecture, hf, what, labels, 0, init_seed,
                        config != nullptr ? config->dropout_rng : DropoutRng::per_sample);
  // A causal-LM checkpoint fine-tuned as a classifier starts its head fresh;
  // a classifier's head is never silently dropped or resized.
  GA_CHECK(saved_labels == 0 || saved_labels == labels, "{}: the checkpoint classifies {} labels, the task has {}",
           what, saved_labels, labels);
  std::vector<std::string> fresh;
  if (saved_labels == 0 && labels > 0) fresh.push_back("score.weight");
  built.load_weights(checkpoint.tensors, gguf ? dir : dir + "/model.safetensors", fresh);
  return built;
}

}  // namespace gradaccum::models
