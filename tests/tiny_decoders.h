// The tiny GPT-2 and BLOOM configurations the decoder tests share (vocabulary
// 64, fixed init seed): small enough for float64 gradient comparisons.
#pragma once

#include <cstdint>

#include "gradaccum/models/bloom.h"
#include "gradaccum/models/gpt2.h"

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

}  // namespace gradaccum::testing
