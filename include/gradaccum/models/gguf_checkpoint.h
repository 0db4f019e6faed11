// llama.cpp's GGUF files as checkpoints of the Llama family: a file is turned into what an HF
// checkpoint directory holds (hf_checkpoint.h), a config.json object and tensors under HF's
// names and layouts, so that the model code never asks where its weights came from.
//
// The facts, as transformers' GGUF loader has them (modeling_gguf_pytorch_utils.py,
// integrations/ggml.py):
//  - config.json from the metadata of general.architecture "llama": block_count,
//    embedding_length, feed_forward_length, attention.head_count, attention.head_count_kv
//    (absent: head_count), context_length, attention.layer_norm_rms_epsilon, rope.freq_base
//    (absent: 10000); head_dim from attention.key_length (value_length must agree), else
//    rope.dimension_count, else embedding_length / head_count; vocab_size from llama.vocab_size,
//    else the number of tokenizer.ggml.tokens, else token_embd's rows; tied embeddings when the
//    file has no `output` tensor; the tokenizer's bos/eos/padding ids. rope.scaling.type linear
//    and yarn (with rope.scaling.factor, rope.scaling.original_context_length) become
//    rope_parameters; none is the default.
//  - tensors: token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
//    ffn_gate, ffn_up, ffn_down}, output_norm, output, under their HF names
//    (model.embed_tokens, model.layers.N.self_attn.q_proj, ..., lm_head), dequantized to float32
//    (formats/gguf.h). llama.cpp's converter interleaves the two rotary halves of every head's
//    attn_q and attn_k rows; they are put back in HF's order (head h's rows [d0 d0' d1 d1' ...]
//    → [d0 d1 ... d0' d1' ...]), per query head for attn_q, per key-value head for attn_k.
// Checked before anything of the claimed size is allocated: every expected tensor is present
// with the shape the metadata gives it, and no other tensor is in the file. Every problem is a
// one-line gradaccum::Error naming the file and the key or tensor; another architecture names
// general.architecture.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "gradaccum/formats/gguf.h"
#include "gradaccum/models/hf_checkpoint.h"

namespace gradaccum::models {

// Whether `path` is a GGUF file to read as a checkpoint: a name ending in ".gguf" that is not a
// directory.
bool is_gguf_path(const std::string& path);

// The config.json the file's metadata describes (model_type "llama"), its shapes checked against
// the file's tensor infos; no tensor is read.
nlohmann::json gguf_hf_config(const formats::GgufFile& file);

// The whole checkpoint: gguf_hf_config and every tensor dequantized under its HF name.
HfCheckpoint read_gguf_checkpoint(const std::string& path);

}  // namespace gradaccum::models
