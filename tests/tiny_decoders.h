// The tiny GPT-2, BLOOM and Llama configurations the decoder tests share (GPT-2's and BLOOM's:
// vocabulary 64, fixed init seed): small enough for float64 gradient comparisons.
#pragma once

#include <cstdint>

#include "gradaccum/models/bloom.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/models/model_factory.h"

namespace gradaccum::testing {

inline models::Gpt2Config tiny_gpt2_config(int64_t n_layer = 2) {
  models::Gpt2Config c;
  c.vocab_size = 64;
  c.n_positions = 32;
  c.n_embd = 16;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.init_seed = 1234;
  return c;
}

inline models::BloomConfig tiny_bloom_config(int64_t n_layer = 2) {
  models::BloomConfig c;
  c.vocab_size = 64;
  c.hidden_size = 24;
  c.n_layer = n_layer;
  c.n_head = 6;  // not a power of two: ALiBi's interleaved extra slopes are used
  c.init_seed = 1234;
  return c;
}

// The Llama family's decoder: RoPE, RMSNorm, SwiGLU and grouped-query attention (2 key-value
// heads for 4 query heads); make_language_model("llama", ...) builds it with a vocabulary.
inline models::ModelConfig tiny_llama_config(int64_t n_layer = 2) {
  models::ModelConfig c;
  c.type = "llama";
  c.n_layer = n_layer;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.intermediate_size = 40;
  c.n_positions = 16;
  return c;
}

}  // namespace gradaccum::testing
