// The decoder architectures gradaccum builds, one table entry per family: how its Hugging Face
// config.json maps to a backbone and back, how its tensor names map onto the modules, which
// dropouts it has, and the config.json of a fresh model. `model.type` (model_types.h), the
// builder (built_model.h) and the checkpoint code (hf_checkpoint.h) read this table; nothing
// else branches on an architecture's name.
//
// llama, qwen2, qwen3 and mistral are options of one decoder (transformer.h); gpt2 and bloom
// keep their own modules (gpt2.h, bloom.h) behind the same entry shape. A new family is an entry
// in decoder_architectures() (models/architectures.cpp) and a case in the HF parity tests
// (tests/hf/save_pretrained_models.py); docs/development.md says what an entry takes.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gradaccum/models/decoder.h"
#include "gradaccum/models/model_factory.h"
#include "gradaccum/models/sample_dropout.h"

namespace gradaccum::models {

// How a family's checkpoint tensors are named and laid out against the module's own
// named_parameters(). The heads hold the backbone as `transformer.` (decoder.h).
struct HfTensorNames {
  // HF's base_model_prefix with its dot: what `transformer.` is called in the family's files.
  std::string hf_prefix = "transformer.";
  // The module's name of the token embedding a tied `lm_head.weight` shares.
  std::string tied_to;
  // Parameter name suffixes whose HF tensor is the transpose of ours (GPT-2's Conv1D).
  std::vector<std::string> transposed;
  // Name suffixes of non-parameter buffers that checkpoints may carry (ignored).
  std::vector<std::string> ignored;
};

// What config.json claims about sizes that the checkpoint's tensors must bear out, checked
// before a model of the claimed size is built (read_hf_checkpoint): a dimension claim names the
// config.json keys of one value (the first present is read), the tensor (as the module names it,
// without the file prefix) and the dimension that value sizes; the number of blocks is counted
// from the tensor names "<block_prefix><i>.".
struct SizeClaim {
  std::vector<std::string> keys;
  std::string tensor;
  int64_t dim = 0;
};
struct SizeClaims {
  std::vector<SizeClaim> dimensions;
  std::vector<std::string> layer_keys;
  std::string block_prefix;
};

// A backbone built from a config.json.
struct BuiltDecoder {
  Decoder decoder{nullptr};
  nlohmann::json hf_config;  // the config.json this backbone writes (of a causal LM)
  bool tie_word_embeddings = true;
  double initializer_range = 0.02;
};

struct DecoderArchitecture {
  std::string name;                               // model.type and config.json's model_type
  std::string display;                            // for messages: "GPT-2", "Llama"
  std::string help;                               // one line for the configuration reference
  std::string causal_lm_class, classifier_class;  // HF's class names (config.json "architectures")
  HfTensorNames tensors;
  SizeClaims size_claims;
  // The family's dropouts under their config.json names, which are also its model.<name> keys.
  std::vector<std::string> dropouts;
  // The backbone of a config.json, every field checked (errors name `what` and the key);
  // fresh weights drawn from init_seed, dropout masks from dropout_rng's generator.
  std::function<BuiltDecoder(const nlohmann::json& config, const std::string& what, uint64_t init_seed,
                             DropoutRng dropout_rng)>
      build;
  // The config.json of a fresh model from the `model:` section, with `vocab_size` ids unless
  // model.vocab_size is larger (errors name the model.* key).
  std::function<nlohmann::json(const ModelConfig& config, int64_t vocab_size)> fresh_config;
};

// Every decoder architecture, in the order the configuration reference lists them.
const std::vector<DecoderArchitecture>& decoder_architectures();

// The entry named `name`, or null.
const DecoderArchitecture* find_decoder_architecture(const std::string& name);

// The entry of config.json's "model_type"; a gradaccum::Error naming `what` and the supported
// types otherwise.
const DecoderArchitecture& decoder_architecture_of(const nlohmann::json& config, const std::string& what);

// `config` for a task: "architectures" [the causal-LM class] when num_labels is 0, else [the
// classifier class] with id2label and label2id (LABEL_0 ..) for num_labels labels.
nlohmann::json hf_config_for_task(const DecoderArchitecture& architecture, nlohmann::json config, int64_t num_labels);

}  // namespace gradaccum::models
