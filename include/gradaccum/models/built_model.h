// A model as the program trains, saves and loads it: the task the engine sees,
// plus how its weights map to files. Image networks keep libtorch's parameter
// names; language models use Hugging Face's names and config.json (the
// architecture table, architectures.h), so their checkpoints load in HF's own code.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gradaccum/core/trainable.h"
#include "gradaccum/models/causal_lm.h"
#include "gradaccum/models/model_factory.h"

namespace gradaccum::models {

using WeightList = std::vector<std::pair<std::string, torch::Tensor>>;
struct LoraAdapters;  // lora.h

struct BuiltModel {
  std::unique_ptr<core::Trainable> task;
  std::string architecture;   // "" (image networks) | a name of decoder_architectures()
  nlohmann::json hf_config;   // null for image networks
  int64_t num_labels = 0;     // 0: a causal language model
  int64_t max_positions = 0;  // the longest sequence (0: unbounded)
  int64_t vocab_size = 0;

  // Its LoRA adapters (lora.h); null: every parameter trains and weights() are the whole model.
  std::shared_ptr<LoraAdapters> lora;

  bool is_language_model() const { return !architecture.empty(); }
  // CPU copies of the weights under their file names (HF names for LMs); with adapters, the
  // trained tensors only, under PEFT's names.
  WeightList weights();
  // Copies weights in; errors name the tensor and `what`. `may_be_missing`
  // names parameters that keep their values when absent (a fresh head).
  void load_weights(const WeightList& weights, const std::string& what,
                    const std::vector<std::string>& may_be_missing = {});
  // The causal-LM head, for generation (null for other tasks).
  CausalLmHeadImpl* causal_lm();

  // Memory for compute (issue 5); both throw gradaccum::Error naming the key
  // when the model has nothing to apply them to.
  // Recompute each transformer block's activations in backward.
  void set_gradient_checkpointing(bool enabled);
  // Causal LMs: the loss over chunks of at most `tokens` tokens (0 = whole).
  void set_loss_chunk_tokens(int64_t tokens);

  Decoder backbone{nullptr};  // the transformer (null for image networks)
};

// A fresh language model of architecture `name` (architectures.h) from the `model:` section: a
// causal LM when `num_labels` is 0, else a sequence classifier with that many labels.
// `vocab_size` comes from the tokenizer unless the config sets one. The section's dropout keys
// must be the architecture's (an error names them otherwise).
BuiltModel make_language_model(const std::string& name, const ModelConfig& config, int64_t vocab_size,
                               int64_t num_labels, uint64_t init_seed);

// The model a config.json describes (its "model_type" picks the architecture), with fresh weights
// from `init_seed`: a causal LM when `num_labels` is 0, else a classifier. `what` names the
// config in errors.
BuiltModel language_model_from_hf_config(const nlohmann::json& config, const std::string& what, int64_t num_labels,
                                         uint64_t init_seed);

// A model from an HF checkpoint directory (config.json + model.safetensors or its shards), or
// from a GGUF file (a path ending in .gguf; gguf_checkpoint.h), read as the HF checkpoint it
// stands for.
// `num_labels` < 0: the task the checkpoint was saved for; 0: a causal LM;
// > 0: a classifier — from a causal-LM checkpoint the `score` head starts
// fresh (seeded by `init_seed`), as HF's from_pretrained does. `config`, when given, overrides
// the checkpoint's dropout with its model.<name> keys that are not -1.
BuiltModel load_language_model(const std::string& dir, int64_t num_labels, uint64_t init_seed,
                               const ModelConfig* config = nullptr);

}  // namespace gradaccum::models
