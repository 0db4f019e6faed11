#include "gradaccum/models/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "gradaccum/base/check.h"

namespace gradaccum::models {

std::vector<int64_t> generate(CausalLmHeadImpl& model, const std::vector<int64_t>& prompt,
                              const GenerationOptions& options) {
  GA_CHECK(!prompt.empty(), "generate: the prompt has no tokens");
  GA_CHECK(options.max_new_tokens >= 0, "--max-new-tokens must be >= 0, got {}", options.max_new_tokens);
  GA_CHECK(options.temperature >= 0, "--temperature must be >= 0, got {}", options.temperature);
  GA_CHECK(options.top_k >= 0, "--top-k must be >= 0, got {}", options.top_k);
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const auto device = model.parameters().front().device();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);

  std::vector<int64_t> context = prompt;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const auto first = options.max_positions > 0 && static_cast<int64_t>(context.size()) > options.max_positions
                           ? context.size() - static_cast<size_t>(options.max_positions)
                           : size_t{0};
    auto ids = torch::tensor(std::vector<int64_t>(context.begin() + static_cast<std::ptrdiff_t>(first), context.end()),
                             torch::kLong)
                   .unsqueeze(0)
                   .to(device);
    auto logits = model.forward(ids).select(1, -1).squeeze(0).to(torch::kCPU, torch::kDouble);
    int64_t next = 0;
    if (options.temperature == 0.0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / options.temperature;
      if (options.top_k > 0 && options.top_k < logits.size(0)) {
        const auto kth = std::get<0>(logits.topk(options.top_k)).select(0, -1);
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
      }
      next = torch::multinomial(torch::softmax(logits, 0), 1, false, generator).item<int64_t>();
    }
    out.push_back(next);
    context.push_back(next);
    if (options.on_token) options.on_token(next);
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), next) != options.stop_tokens.end()) break;
  }
  model.train(was_training);
  return out;
}

std::string generate_text(CausalLmHeadImpl& model, const data::Tokenizer& tokenizer, const std::string& prompt,
                          GenerationOptions options, const std::function<void(const std::string&)>& on_text) {
  const auto encoded = tokenizer.encode(prompt);
  GA_CHECK(!encoded.empty(), "generate: the prompt \"{}\" encodes to no token", prompt);
  if (options.stop_tokens.empty()) {
    if (const auto end_of_text = tokenizer.token_id("<|endoftext|>")) options.stop_tokens.push_back(*end_of_text);
  }
  const auto stops = [&](int64_t id) {
    return std::find(options.stop_tokens.begin(), options.stop_tokens.end(), id) != options.stop_tokens.end();
  };
  // Streamed as bytes: what the tokens so far decode to, past what was already given. Byte-level
  // BPE decodes a longer list to a longer string with the same start, so the pieces add up to
  // the whole (a character split across tokens arrives in two pieces, as a terminal expects).
  std::vector<data::TokenId> drawn;
  std::string given;
  if (on_text) {
    options.on_token = [&](int64_t id) {
      if (stops(id)) return;
      drawn.push_back(static_cast<data::TokenId>(id));
      const auto text = tokenizer.decode(drawn);
      if (text.size() > given.size() && text.compare(0, given.size(), given) == 0) {
        on_text(text.substr(given.size()));
        given = text;
      }
    };
  }
  const auto ids = generate(model, std::vector<int64_t>(encoded.begin(), encoded.end()), options);
  std::vector<data::TokenId> tokens(ids.begin(), ids.end());
  if (!tokens.empty() && stops(tokens.back())) tokens.pop_back();
  auto text = tokenizer.decode(tokens);
  if (on_text && text.size() > given.size() && text.compare(0, given.size(), given) == 0) {
    on_text(text.substr(given.size()));
  }
  return text;
}

std::vector<int64_t> eos_token_ids(const nlohmann::json& hf_config) {
  if (!hf_config.is_object() || !hf_config.contains("eos_token_id") || hf_config.at("eos_token_id").is_null())
    return {};
  const auto& eos = hf_config.at("eos_token_id");
  std::vector<int64_t> ids;
  if (eos.is_number_integer()) {
    ids.push_back(eos.get<int64_t>());
  } else if (eos.is_array()) {
    for (const auto& id : eos) {
      GA_CHECK(id.is_number_integer(), "config.json: eos_token_id holds {}, not a token id", id.dump());
      ids.push_back(id.get<int64_t>());
    }
  } else {
    GA_CHECK(false, "config.json: eos_token_id is {}, not a token id or a list of them", eos.dump());
  }
  for (const auto id : ids) GA_CHECK(id >= 0, "config.json: eos_token_id {} is negative", id);
  return ids;
}

}  // namespace gradaccum::models
