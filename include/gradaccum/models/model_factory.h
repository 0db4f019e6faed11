// Builds a model from its configuration section (`model:` in the YAML).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gradaccum/core/trainable.h"
#include "gradaccum/models/memory_format.h"
#include "gradaccum/models/norm.h"
#include "gradaccum/models/sample_dropout.h"

namespace gradaccum::models {

struct ModelConfig {
  std::string type = "cnn";         // a name of models/model_types.h
  NormKind norm = NormKind::group;  // image networks
  int64_t norm_groups = 8;
  std::vector<int64_t> channels = {32, 64};              // cnn and resnet
  MemoryFormat memory_format = MemoryFormat::automatic;  // cnn and resnet
  std::vector<int64_t> hidden = {256, 128};              // mlp; the cnn uses hidden[0] for its dense layer
  // Language models (HF's GPT2Config names; BLOOM's hidden_size is n_embd).
  int64_t n_layer = 4;
  int64_t n_embd = 128;
  int64_t n_head = 4;
  int64_t n_positions = 128;  // GPT-2's position table; BLOOM has none
  int64_t vocab_size = 0;     // 0: the tokenizer's
  // The Llama family (llama, qwen2, qwen3, mistral) of a fresh model.
  int64_t n_kv_head = 0;          // key-value heads (0: n_head)
  int64_t head_dim = 0;           // 0: n_embd / n_head
  int64_t intermediate_size = 0;  // SwiGLU width (0: 4 n_embd)
  double rope_theta = 10000.0;
  int64_t sliding_window = 0;  // mistral, qwen2, qwen3: every layer's window (0: none)
  std::string hf_checkpoint;   // a directory with config.json + model.safetensors, or a .gguf file
  // Memory savings (top-level keys, as in HF TrainingArguments).
  bool gradient_checkpointing = false;  // recompute block activations in backward
  int64_t loss_chunk_tokens = 0;        // fused LM-head loss chunk; 0 = automatic
  // Dropout under HF's config names; -1: the hf_checkpoint's config.json value, else 0.
  double resid_pdrop = -1, embd_pdrop = -1, attn_pdrop = -1;  // GPT-2
  double hidden_dropout = -1, attention_dropout = -1;         // BLOOM (attention_dropout: the Llama family's too)
  double dropout = 0.0;                                       // the cnn: after its dense layer
  DropoutRng dropout_rng = DropoutRng::per_sample;
};

// The image classifiers for 28×28 grey images and `classes` classes, one per model.type
// (models/model_types.h lists them); each checks its section and names a bad key.
std::unique_ptr<core::Trainable> make_mlp(const ModelConfig& config, int64_t classes);
std::unique_ptr<core::Trainable> make_cnn(const ModelConfig& config, int64_t classes);
std::unique_ptr<core::Trainable> make_resnet(const ModelConfig& config, int64_t classes);

}  // namespace gradaccum::models
