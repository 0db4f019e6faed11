// Sampling a continuation from a causal language model: temperature, top-k,
// a seeded generator of its own (so a sample does not disturb, and is not
// disturbed by, the training RNG). The whole context is re-run for every new
// token — no key/value cache — which is plenty for the small models trained
// here and keeps the decoders free of generation-only state.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
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
  // Stop after emitting any of these ids (the model's eos_token_id: SmolLM2-Instruct's <|im_end|>,
  // Llama 3's three end tokens); empty in generate_text: the tokenizer's <|endoftext|>, if any.
  std::vector<int64_t> stop_tokens;
  int64_t max_positions = 0;              // > 0: keep only the last max_positions tokens as context
  std::function<void(int64_t)> on_token;  // called with each new id as soon as it is drawn
};

// The new token ids (not the prompt). The prompt must not be empty. Runs in
// eval mode under NoGradGuard and restores the module's training mode.
std::vector<int64_t> generate(CausalLmHeadImpl& model, const std::vector<int64_t>& prompt,
                              const GenerationOptions& options);

// The continuation of `prompt` as text, as `train`'s sample and `gradaccum generate` print it: the
// prompt encoded by `tokenizer`, generated until max_new_tokens or a stop token
// (options.stop_tokens; when empty, the tokenizer's <|endoftext|> when it has one), decoded
// without that token. Throws
// gradaccum::Error when the prompt encodes to no token. `on_text`, when given, receives the
// continuation piece by piece as the tokens are drawn (their concatenation is the returned text),
// so a caller can print it as it grows.
std::string generate_text(CausalLmHeadImpl& model, const data::Tokenizer& tokenizer, const std::string& prompt,
                          GenerationOptions options, const std::function<void(const std::string&)>& on_text = {});

// The end-of-sequence ids an HF config.json names: its eos_token_id, a number or a list (Llama 3
// lists three); empty when it names none. Throws gradaccum::Error when the key holds anything else.
std::vector<int64_t> eos_token_ids(const nlohmann::json& hf_config);

}  // namespace gradaccum::models
