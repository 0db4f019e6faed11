// Hugging Face checkpoint directories (`config.json` + `model.safetensors`, or
// shards listed in `model.safetensors.index.json`) for every architecture of the
// table (architectures.h): reading and writing them, mapping their tensors onto a
// libtorch module and back, and converting GPT-2's and BLOOM's configs.
//
// Our modules register their parameters under HF's names (models/gpt2.h,
// models/transformer.h), so the mapping is the module's own named_parameters()
// plus the table entry's rules (HfTensorNames) for what differs:
//   - The heads hold the backbone as `transformer.`; a family whose HF classes
//     call it otherwise (the Llama family's `model.`) has it renamed on save and load.
//   - GPT-2 uses HF's Conv1D, weight [in, out], where we use nn::Linear,
//     weight [out, in]: attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj
//     weights are transposed on save and load. BLOOM's are nn::Linear in HF
//     too: no transposes.
//   - The LM head is tied to the token embedding (GPT-2 transformer.wte,
//     BLOOM transformer.word_embeddings): `lm_head.weight` is not written (as
//     HF's save_pretrained drops tied duplicates) and, if a checkpoint carries
//     it, its shape is checked and it is ignored. Likewise any parameter of the
//     module that is the same tensor as an earlier one.
//   - Checkpoints saved from the bare backbone (OpenAI's original gpt2 files,
//     BLOOM's published ones) lack the `transformer.` prefix: accepted.
//   - Old GPT-2 checkpoints carry the non-parameter buffers `attn.bias` (the
//     causal mask) and `attn.masked_bias`: ignored.
//   - A sequence classifier holds the backbone as `transformer` and a bias-free
//     `score` Linear: `score.weight`, no transpose, as in HF's
//     GPT2ForSequenceClassification / BloomForSequenceClassification.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "gradaccum/formats/safetensors.h"
#include "gradaccum/models/bloom.h"
#include "gradaccum/models/gpt2.h"

namespace gradaccum::models {

// A checkpoint directory's content, tensors under HF's names and layouts.
struct HfCheckpoint {
  nlohmann::json config;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
};

// Reads `dir`/config.json (a JSON object) and `dir`/model.safetensors, or
// without it the shards that `dir`/model.safetensors.index.json's weight_map
// lists (each tensor in the shard the index names). Pickle (pytorch_model.bin)
// checkpoints are refused with an error saying so.
HfCheckpoint read_hf_checkpoint(const std::string& dir);

// A checkpoint's JSON file (config.json, the shard index, adapter_config.json); unreadable or
// malformed text is a gradaccum::Error naming the file, on one line.
nlohmann::json read_json_file(const std::string& path);

// Writes config.json and model.safetensors into `<dir>.tmp-<pid>`, fsyncs
// them, then swaps that directory in for `dir` (replacing an existing one, by
// renameat2's RENAME_EXCHANGE where the filesystem supports it), so `dir` is
// never half of a checkpoint. On failure the staging directory is removed.
void write_hf_checkpoint(const std::string& dir, const HfCheckpoint& checkpoint);

// Copies `tensors` (HF names and layouts) into `module`'s parameters, converted
// to each parameter's dtype and device, under NoGradGuard. `architecture` is
// a name of decoder_architectures(); `what` names the source in errors. Everything is checked
// before anything is copied, so on error the module is unchanged. Errors name
// the tensor: a parameter with no tensor, a shape mismatch (in the checkpoint's
// layout), a tensor that is no parameter (except the ignored ones above), two
// tensors for one parameter, a non-floating-point tensor.
// `may_be_missing`: parameter names that keep their current values when the
// checkpoint lacks them, e.g. {"score.weight"} to fine-tune a classifier from a
// causal-LM checkpoint (HF initializes that head afresh, too).
void load_hf_tensors(torch::nn::Module& module, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                     const std::string& architecture, const std::string& what,
                     const std::vector<std::string>& may_be_missing = {});

// The module's parameters under HF's names and layouts, as CPU copies in the
// parameters' dtype (a snapshot: training on does not change them).
// `keep`, when given, selects the parameters by their module name (e.g. the trainable ones).
std::vector<std::pair<std::string, torch::Tensor>> hf_tensors(
    torch::nn::Module& module, const std::string& architecture,
    const std::function<bool(const std::string& name, const torch::Tensor& parameter)>& keep = nullptr);

// The checkpoint's name of a module path or parameter name of `architecture`'s model: the heads'
// `transformer.` becomes the family's prefix (HF's `model.` for the Llama family).
std::string hf_name_of(const std::string& architecture, const std::string& name);

// config.json's "model_type" (a name of decoder_architectures(); anything else is an error).
std::string hf_model_type(const nlohmann::json& config, const std::string& what);

// 0 for a causal-LM checkpoint; the number of labels of a
// ...ForSequenceClassification one (id2label's size, else num_labels, else
// HF's default of 2).
int64_t hf_num_labels(const nlohmann::json& config, const std::string& what);

// HF's GPT2Config for `config`: model_type "gpt2", architectures
// ["GPT2LMHeadModel"], or ["GPT2ForSequenceClassification"] with id2label and
// label2id when num_labels > 0; activation "gelu_new", tied embeddings, the
// config's dropout probabilities, bos/eos 50256 for GPT-2's 50257-token vocab.
nlohmann::json gpt2_hf_config(const Gpt2Config& config, int64_t num_labels = 0);

// The Gpt2Config of an HF GPT2Config. Required: model_type "gpt2", vocab_size,
// n_positions, n_embd, n_layer, n_head (positive integers); optional:
// layer_norm_epsilon, initializer_range, resid_pdrop, embd_pdrop, attn_pdrop
// (HF's default 0.1 when absent). Settings this model cannot honour
// (another activation, n_inner != 4 n_embd, untied embeddings, cross
// attention, unscaled or layer-scaled attention) are errors naming the key.
// init_seed is 0: the checkpoint's weights replace the initialization.
Gpt2Config gpt2_config_from_hf(const nlohmann::json& config, const std::string& what);

// HF's BloomConfig for `config`: model_type "bloom", architectures
// ["BloomForCausalLM"], or ["BloomForSequenceClassification"] with id2label
// and label2id when num_labels > 0; pre-LayerNorm residuals, tied embeddings,
// the config's dropout probabilities; bos/eos/pad 1/2/3 for BLOOM's 250880-token vocabulary.
nlohmann::json bloom_hf_config(const BloomConfig& config, int64_t num_labels = 0);

// The BloomConfig of an HF BloomConfig. Required: model_type "bloom",
// vocab_size, hidden_size (or its old name n_embed), n_layer (or
// num_hidden_layers), n_head (or num_attention_heads); optional:
// layer_norm_epsilon, initializer_range, hidden_dropout, attention_dropout
// (HF's default 0 when absent). Post-LayerNorm residuals
// (apply_residual_connection_post_layernorm) and untied embeddings are errors.
BloomConfig bloom_config_from_hf(const nlohmann::json& config, const std::string& what);

}  // namespace gradaccum::models
