// Sampling a continuation from a causal language model: temperature, top-k,
// a seeded generator of its own (so a sample does not disturb, and is not
// disturbed by, the training RNG). The whole context is re-run for every new
// token — no key/value cache — which is plenty for the small models trained
// here and keeps the decoders free of generation-only state.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "gradaccum/models/causal_lm.h"

namespace gradaccum::models {

struct GenerationOptions {
  int64_t max_new_tokens = 50;
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // > 0: sample among the k most likely tokens only
  uint64_t seed = 0;
  int64_t stop_token = -1;    // >= 0: stop after emitting this id (e.g. <|endoftext|>)
  int64_t max_positions = 0;  // > 0: keep only the last max_positions tokens as context
};

// The new token ids (not the prompt). The prompt must not be empty. Runs in
// eval mode under NoGradGuard and restores the module's training mode.
std::vector<int64_t> generate(CausalLmHeadImpl& model, const std::vector<int64_t>& prompt,
                              const GenerationOptions& options);

}  // namespace gradaccum::models
