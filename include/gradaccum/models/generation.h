// Sampling a continuation from a causal language model: temperature, top-k,
// a seeded generator of its own (so a sample does not disturb, and is not
// disturbed by, the training RNG). The whole context is re-run for every new
// token — no key/value cache — which is plenty for the small models trained
// here and keeps the decoders free of generation-only state.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gradaccum/data/tokenizer.h"
#include "gradaccum/models/causal_lm.h"

namespace gradaccum::models {

// The defaults are those of `train`'s sample.* keys and of `gradaccum generate`'s flags.
struct GenerationOptions {
  int64_t max_new_tokens = 40;
  double temperature = 0.8;  // 0: greedy (argmax)
  int64_t top_k = 40;        // > 0: sample among the k most likely tokens only
  uint64_t seed = 0;
  int64_t stop_token = -1;                // >= 0: stop after emitting this id (e.g. <|endoftext|>)
  int64_t max_positions = 0;              // > 0: keep only the last max_positions tokens as context
  std::function<void(int64_t)> on_token;  // called with each new id as soon as it is drawn
};

// The new token ids (not the prompt). The prompt must not be empty. Runs in
// eval mode under NoGradGuard and restores the module's training mode.
std::vector<int64_t> generate(CausalLmHeadImpl& model, const std::vector<int64_t>& prompt,
                              const GenerationOptions& options);

// The continuation of `prompt` as text, as `train`'s sample and `gradaccum generate` print it: the
// prompt encoded by `tokenizer`, generated until max_new_tokens or the tokenizer's end-of-text
// token (when it has one; options.stop_token is set from it), decoded without that token. Throws
// gradaccum::Error when the prompt encodes to no token. `on_text`, when given, receives the
// continuation piece by piece as the tokens are drawn (their concatenation is the returned text),
// so a caller can print it as it grows.
std::string generate_text(CausalLmHeadImpl& model, const data::Tokenizer& tokenizer, const std::string& prompt,
                          GenerationOptions options, const std::function<void(const std::string&)>& on_text = {});

}  // namespace gradaccum::models
