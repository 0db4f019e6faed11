#include "gradaccum/models/architectures.h"

#include <algorithm>
#include <cmath>

#include "gradaccum/base/check.h"
#include "gradaccum/models/bloom.h"
#include "gradaccum/models/gpt2.h"
#include "gradaccum/models/hf_checkpoint.h"
#include "gradaccum/models/hf_config_fields.h"
#include "gradaccum/models/transformer.h"

namespace gradaccum::models {

namespace {

namespace fields = hf_fields;

// The checks every fresh language model shares; its vocabulary.
int64_t fresh_vocab(const ModelConfig& config, int64_t vocab_size) {
  GA_CHECK(config.n_layer >= 1 && config.n_embd >= 1 && config.n_head >= 1,
           "model: n_layer, n_embd and n_head must be >= 1");
  const int64_t vocab = config.vocab_size > 0 ? config.vocab_size : vocab_size;
  GA_CHECK(vocab >= vocab_size, "key 'model.vocab_size': {} is smaller than the tokenizer's {} ids", vocab, vocab_size);
  return vocab;
}

void check_divisible_width(const ModelConfig& config) {
  GA_CHECK(config.n_embd % config.n_head == 0, "model: n_embd {} is not a multiple of n_head {}", config.n_embd,
           config.n_head);
}

// --- GPT-2 and BLOOM: their own modules, their config converters (hf_checkpoint.h) ---------

BuiltDecoder build_gpt2(const nlohmann::json& json, const std::string& what, uint64_t init_seed, DropoutRng rng) {
  auto c = gpt2_config_from_hf(json, what);
  c.init_seed = init_seed;
  c.dropout_rng = rng;
  return {as_decoder(Gpt2Model(c)), gpt2_hf_config(c), c.tie_word_embeddings, c.initializer_range};
}

nlohmann::json fresh_gpt2(const ModelConfig& config, int64_t vocab_size) {
  const int64_t vocab = fresh_vocab(config, vocab_size);
  check_divisible_width(config);
  GA_CHECK(config.n_positions >= 2, "key 'model.n_positions': must be >= 2, got {}", config.n_positions);
  Gpt2Config c;
  c.vocab_size = vocab;
  c.n_positions = config.n_positions;
  c.n_embd = config.n_embd;
  c.n_layer = config.n_layer;
  c.n_head = config.n_head;
  return gpt2_hf_config(c);
}

BuiltDecoder build_bloom(const nlohmann::json& json, const std::string& what, uint64_t init_seed, DropoutRng rng) {
  auto c = bloom_config_from_hf(json, what);
  c.init_seed = init_seed;
  c.dropout_rng = rng;
  return {as_decoder(BloomModel(c)), bloom_hf_config(c), c.tie_word_embeddings, c.initializer_range};
}

nlohmann::json fresh_bloom(const ModelConfig& config, int64_t vocab_size) {
  const int64_t vocab = fresh_vocab(config, vocab_size);
  check_divisible_width(config);
  BloomConfig c;
  c.vocab_size = vocab;
  c.hidden_size = config.n_embd;
  c.n_layer = config.n_layer;
  c.n_head = config.n_head;
  return bloom_hf_config(c);
}

// --- The Llama family: RoPE, RMSNorm, SwiGLU, grouped-query attention ------------------------

// What the Llama-like families' config.json files differ in.
struct LlamaFamily {
  std::string model_type;
  int64_t default_max_positions;  // max_position_embeddings when absent
  int64_t default_head_dim;       // head_dim when absent (0: hidden_size / num_attention_heads)
  enum class Bias {
    attention_bias,  // "attention_bias" puts a bias on q, k, v and o (llama, qwen3)
    qkv,             // always on q, k and v, never on o (qwen2)
    none,            // never (mistral)
  } bias;
  bool mlp_bias_key;  // "mlp_bias" (llama)
  bool qk_norm;       // q_norm and k_norm (qwen3)
  enum class Window {
    none,     // full attention everywhere (llama)
    uniform,  // "sliding_window" on every layer, 4096 when absent, null: none (mistral)
    qwen,     // "use_sliding_window", "sliding_window", "max_window_layers", "layer_types" (qwen2, qwen3)
  } window;
};

const nlohmann::json* present(const nlohmann::json& config, const char* key) {
  const auto* value = fields::field(config, key);
  return value == nullptr || value->is_null() ? nullptr : value;
}

double number_field(const nlohmann::json& object, const char* key, const std::string& where, const std::string& what) {
  const auto& value = object.at(key);
  GA_CHECK(value.is_number(), "{}: config.json \"{}\" field \"{}\" must be a number, got {}", what, where, key,
           value.dump());
  return value.get<double>();
}

// RoPE settings in either spelling: transformers 5's "rope_parameters" {rope_type, rope_theta,
// factor, ...}, or the top-level "rope_theta" with "rope_scaling" {rope_type | type, factor,
// low_freq_factor, high_freq_factor, original_max_position_embeddings, ...}; as transformers
// reads them, rope_scaling wins over rope_parameters and rope_theta fills a missing theta.
RopeOptions rope_from_hf(const nlohmann::json& config, const std::string& what) {
  const char* where = present(config, "rope_scaling") ? "rope_scaling" : "rope_parameters";
  nlohmann::json params = nlohmann::json::object();
  if (const auto* p = present(config, where)) {
    GA_CHECK(p->is_object(), "{}: config.json \"{}\" must be an object, got {}", what, where, p->dump());
    params = *p;
  }
  GA_CHECK(!params.contains("full_attention") && !params.contains("sliding_attention"),
           "{}: config.json \"{}\" holds settings per layer type; one setting for every layer is supported", what,
           where);
  RopeOptions rope;
  rope.theta = fields::optional_positive_number(config, "rope_theta", 10000.0, what);
  if (params.contains("rope_theta")) rope.theta = number_field(params, "rope_theta", where, what);
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (params.contains(key)) {
      GA_CHECK(params[key].is_string(), "{}: config.json \"{}\" field \"{}\" must be a string, got {}", what, where,
               key, params[key].dump());
      type = params[key].get<std::string>();
      break;
    }
  }
  rope.type = parse_rope_type(type, what + ": config.json \"" + where + "\"");
  auto optional = [&](const char* key) -> std::optional<double> {
    if (!params.contains(key) || params[key].is_null()) return std::nullopt;
    return number_field(params, key, where, what);
  };
  auto required = [&](const char* key) {
    GA_CHECK(params.contains(key) && !params[key].is_null(), "{}: config.json \"{}\" of rope_type {} has no \"{}\"",
             what, where, type, key);
    return number_field(params, key, where, what);
  };
  if (const auto partial = optional("partial_rotary_factor")) {
    GA_CHECK(*partial == 1.0, "{}: config.json \"{}\" \"partial_rotary_factor\" is {}; only 1 is supported", what,
             where, *partial);
  }
  if (rope.type != RopeType::standard) rope.factor = required("factor");
  if (rope.type == RopeType::llama3) {
    rope.low_freq_factor = required("low_freq_factor");
    rope.high_freq_factor = required("high_freq_factor");
  }
  if (rope.type == RopeType::llama3 || rope.type == RopeType::yarn) {
    if (const auto original = optional("original_max_position_embeddings")) {
      rope.original_max_position_embeddings = static_cast<int64_t>(*original);
    }
  }
  if (rope.type == RopeType::yarn) {
    rope.attention_factor = optional("attention_factor");
    rope.beta_fast = optional("beta_fast");
    rope.beta_slow = optional("beta_slow");
    rope.mscale = optional("mscale");
    rope.mscale_all_dim = optional("mscale_all_dim");
    if (params.contains("truncate")) {
      GA_CHECK(params["truncate"].is_boolean(), "{}: config.json \"{}\" field \"truncate\" must be true or false", what,
               where);
      rope.truncate = params["truncate"].get<bool>();
    }
  }
  return rope;
}

// transformers 5's spelling, which it reads and writes.
nlohmann::json rope_to_hf(const RopeOptions& rope, int64_t max_position_embeddings) {
  nlohmann::json p = {{"rope_type", to_string(rope.type)}, {"rope_theta", rope.theta}};
  if (rope.type != RopeType::standard) p["factor"] = rope.factor;
  if (rope.type == RopeType::llama3) {
    p["low_freq_factor"] = rope.low_freq_factor;
    p["high_freq_factor"] = rope.high_freq_factor;
  }
  if (rope.type == RopeType::llama3 || rope.type == RopeType::yarn) {
    p["original_max_position_embeddings"] =
        rope.original_max_position_embeddings > 0 ? rope.original_max_position_embeddings : max_position_embeddings;
  }
  if (rope.type == RopeType::yarn) {
    auto put = [&](const char* key, const std::optional<double>& v) {
      if (v) p[key] = *v;
    };
    put("attention_factor", rope.attention_factor);
    put("beta_fast", rope.beta_fast);
    put("beta_slow", rope.beta_slow);
    put("mscale", rope.mscale);
    put("mscale_all_dim", rope.mscale_all_dim);
    p["truncate"] = rope.truncate;
  }
  return p;
}

std::vector<int64_t> windows_from_hf(const LlamaFamily& family, const nlohmann::json& config, int64_t layers,
                                     const std::string& what) {
  std::vector<int64_t> windows(static_cast<size_t>(layers), 0);
  if (family.window == LlamaFamily::Window::none) return windows;
  const auto* w = fields::field(config, "sliding_window");
  const int64_t window = w == nullptr   ? 4096
                         : w->is_null() ? 0
                                        : fields::required_positive_int(config, "sliding_window", what);
  if (family.window == LlamaFamily::Window::uniform) {
    std::fill(windows.begin(), windows.end(), window);
    return windows;
  }
  if (!fields::optional_bool(config, "use_sliding_window", false, what) || window == 0) return windows;
  if (const auto* types = present(config, "layer_types")) {
    GA_CHECK(types->is_array() && static_cast<int64_t>(types->size()) == layers,
             "{}: config.json \"layer_types\" must list one type per layer ({}), got {}", what, layers, types->dump());
    for (int64_t i = 0; i < layers; ++i) {
      const auto& t = (*types)[static_cast<size_t>(i)];
      GA_CHECK(t == "full_attention" || t == "sliding_attention",
               "{}: config.json \"layer_types\" holds {}; supported: \"full_attention\", \"sliding_attention\"", what,
               t.dump());
      if (t == "sliding_attention") windows[static_cast<size_t>(i)] = window;
    }
    return windows;
  }
  const int64_t first =
      present(config, "max_window_layers") ? fields::required_positive_int(config, "max_window_layers", what) : 28;
  for (int64_t i = first; i < layers; ++i) windows[static_cast<size_t>(i)] = window;
  return windows;
}

TransformerOptions llama_options_from_hf(const LlamaFamily& family, const nlohmann::json& config,
                                         const std::string& what) {
  TransformerOptions o;
  o.vocab_size = fields::required_positive_int(config, "vocab_size", what);
  o.hidden_size = fields::required_positive_int(config, "hidden_size", what);
  o.intermediate_size = fields::required_positive_int(config, "intermediate_size", what);
  o.num_layers = fields::required_positive_int(config, "num_hidden_layers", what);
  o.num_heads = fields::required_positive_int(config, "num_attention_heads", what);
  o.num_kv_heads = fields::optional_positive_int(config, "num_key_value_heads", o.num_heads, what);
  GA_CHECK(o.num_heads % o.num_kv_heads == 0,
           "{}: config.json \"num_attention_heads\" {} is not a multiple of \"num_key_value_heads\" {}", what,
           o.num_heads, o.num_kv_heads);
  o.head_dim = fields::optional_positive_int(config, "head_dim", family.default_head_dim, what);
  if (o.head_dim == 0) {
    GA_CHECK(o.hidden_size % o.num_heads == 0,
             "{}: config.json \"hidden_size\" {} is not divisible by \"num_attention_heads\" {}", what, o.hidden_size,
             o.num_heads);
    o.head_dim = o.hidden_size / o.num_heads;
  }
  GA_CHECK(o.head_dim % 2 == 0, "{}: config.json head_dim {} must be even for rotary positions", what, o.head_dim);
  const auto act = fields::optional_string(config, "hidden_act", "silu", what);
  GA_CHECK(act == "silu", "{}: config.json \"hidden_act\" is \"{}\"; this model supports only \"silu\"", what, act);
  o.max_position_embeddings =
      fields::optional_positive_int(config, "max_position_embeddings", family.default_max_positions, what);
  o.positions = PositionKind::rope;
  o.rope = rope_from_hf(config, what);
  o.norm = DecoderNorm::rms_norm;
  o.norm_eps = fields::optional_positive_number(config, "rms_norm_eps", 1e-6, what);
  o.mlp = MlpKind::swiglu;
  switch (family.bias) {
    case LlamaFamily::Bias::attention_bias:
      o.qkv_bias = o.o_bias = fields::optional_bool(config, "attention_bias", false, what);
      break;
    case LlamaFamily::Bias::qkv:
      o.qkv_bias = true;
      break;
    case LlamaFamily::Bias::none:
      break;
  }
  if (family.mlp_bias_key) o.mlp_bias = fields::optional_bool(config, "mlp_bias", false, what);
  o.qk_norm = family.qk_norm;
  o.sliding_windows = windows_from_hf(family, config, o.num_layers, what);
  o.tie_word_embeddings = fields::optional_bool(config, "tie_word_embeddings", false, what);  // HF's default
  o.attention_dropout = fields::optional_probability(config, "attention_dropout", 0.0, what);
  o.initializer_range = fields::optional_positive_number(config, "initializer_range", 0.02, what);
  return o;
}

nlohmann::json llama_hf_config(const LlamaFamily& family, const TransformerOptions& o) {
  nlohmann::json j = {
      {"model_type", family.model_type},
      {"vocab_size", o.vocab_size},
      {"hidden_size", o.hidden_size},
      {"intermediate_size", o.intermediate_size},
      {"num_hidden_layers", o.num_layers},
      {"num_attention_heads", o.num_heads},
      {"num_key_value_heads", o.kv_heads()},
      {"head_dim", o.dim_per_head()},
      {"hidden_act", "silu"},
      {"max_position_embeddings", o.max_position_embeddings},
      {"rms_norm_eps", o.norm_eps},
      {"initializer_range", o.initializer_range},
      {"tie_word_embeddings", o.tie_word_embeddings},
      {"attention_dropout", o.attention_dropout},
      {"rope_theta", o.rope.theta},
      {"rope_parameters", rope_to_hf(o.rope, o.max_position_embeddings)},
      {"use_cache", true},
  };
  if (family.bias == LlamaFamily::Bias::attention_bias) j["attention_bias"] = o.qkv_bias;
  if (family.mlp_bias_key) j["mlp_bias"] = o.mlp_bias;
  const int64_t window =
      o.sliding_windows.empty() ? 0 : *std::max_element(o.sliding_windows.begin(), o.sliding_windows.end());
  if (family.window == LlamaFamily::Window::uniform) {
    j["sliding_window"] = window > 0 ? nlohmann::json(window) : nlohmann::json(nullptr);
  } else if (family.window == LlamaFamily::Window::qwen) {
    nlohmann::json types = nlohmann::json::array();
    int64_t first_sliding = o.num_layers;
    for (int64_t i = 0; i < o.num_layers; ++i) {
      const bool sliding = o.window(i) > 0;
      if (sliding) first_sliding = std::min(first_sliding, i);
      types.push_back(sliding ? "sliding_attention" : "full_attention");
    }
    j["use_sliding_window"] = window > 0;
    j["sliding_window"] = window > 0 ? nlohmann::json(window) : nlohmann::json(nullptr);
    j["max_window_layers"] = first_sliding;
    j["layer_types"] = types;
  }
  return j;
}

BuiltDecoder build_llama(const LlamaFamily& family, const nlohmann::json& json, const std::string& what,
                         uint64_t init_seed, DropoutRng rng) {
  GA_CHECK(fields::optional_string(json, "model_type", family.model_type, what) == family.model_type,
           "{}: config.json \"model_type\" is \"{}\", not \"{}\"", what, json["model_type"].get<std::string>(),
           family.model_type);
  auto o = llama_options_from_hf(family, json, what);
  o.init_seed = init_seed;
  o.dropout_rng = rng;
  auto decoder = TransformerDecoder(o, what);
  auto hf = llama_hf_config(family, o);
  // The tokenizer's special ids are the checkpoint's, kept for what generates from it.
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (const auto* id = present(json, key)) hf[key] = *id;
  }
  return {as_decoder(decoder), hf, o.tie_word_embeddings, o.initializer_range};
}

// A fresh model's config.json from the model: section: width n_embd, n_head query heads of
// head_dim (n_embd / n_head unless set) and n_kv_head key-value heads, a SwiGLU of
// intermediate_size (4 n_embd unless set), RoPE with rope_theta over n_positions, a tied head.
nlohmann::json fresh_llama(const LlamaFamily& family, const ModelConfig& config, int64_t vocab_size) {
  TransformerOptions o;
  o.vocab_size = fresh_vocab(config, vocab_size);
  o.hidden_size = config.n_embd;
  o.num_layers = config.n_layer;
  o.num_heads = config.n_head;
  o.num_kv_heads = config.n_kv_head > 0 ? config.n_kv_head : config.n_head;
  GA_CHECK(o.num_heads % o.num_kv_heads == 0, "key 'model.n_kv_head': {} does not divide model.n_head {}",
           o.num_kv_heads, o.num_heads);
  if (config.head_dim > 0) {
    o.head_dim = config.head_dim;
  } else {
    check_divisible_width(config);
    o.head_dim = config.n_embd / config.n_head;
  }
  GA_CHECK(o.head_dim % 2 == 0, "model: head_dim {} must be even for rotary positions (model.head_dim)", o.head_dim);
  o.intermediate_size = config.intermediate_size > 0 ? config.intermediate_size : 4 * config.n_embd;
  GA_CHECK(config.n_positions >= 2, "key 'model.n_positions': must be >= 2, got {}", config.n_positions);
  o.max_position_embeddings = config.n_positions;
  o.rope.theta = config.rope_theta;
  o.qkv_bias = family.bias == LlamaFamily::Bias::qkv;
  o.qk_norm = family.qk_norm;
  if (config.sliding_window > 0) {
    GA_CHECK(family.window != LlamaFamily::Window::none, "key 'model.sliding_window': {} has no sliding window",
             family.model_type);
    o.sliding_windows.assign(static_cast<size_t>(o.num_layers), config.sliding_window);
  }
  o.tie_word_embeddings = true;
  return llama_hf_config(family, o);
}

DecoderArchitecture llama_entry(const LlamaFamily& family, std::string display, std::string help,
                                std::string class_prefix) {
  DecoderArchitecture a;
  a.name = family.model_type;
  a.display = std::move(display);
  a.help = std::move(help);
  a.causal_lm_class = class_prefix + "ForCausalLM";
  a.classifier_class = class_prefix + "ForSequenceClassification";
  a.tensors.hf_prefix = "model.";
  a.tensors.tied_to = "transformer.embed_tokens.weight";
  a.size_claims = {{{{"vocab_size"}, "embed_tokens.weight", 0}, {{"hidden_size"}, "embed_tokens.weight", 1}},
                   {"num_hidden_layers"},
                   "layers."};
  a.dropouts = {"attention_dropout"};
  a.build = [family](const nlohmann::json& j, const std::string& what, uint64_t seed, DropoutRng rng) {
    return build_llama(family, j, what, seed, rng);
  };
  a.fresh_config = [family](const ModelConfig& c, int64_t vocab) { return fresh_llama(family, c, vocab); };
  return a;
}

}  // namespace

const std::vector<DecoderArchitecture>& decoder_architectures() {
  using Bias = LlamaFamily::Bias;
  using Window = LlamaFamily::Window;
  static const std::vector<DecoderArchitecture> table = [] {
    std::vector<DecoderArchitecture> t;
    DecoderArchitecture gpt2;
    gpt2.name = "gpt2";
    gpt2.display = "GPT-2";
    gpt2.help = "GPT-2 (HF GPT2LMHeadModel / GPT2ForSequenceClassification)";
    gpt2.causal_lm_class = "GPT2LMHeadModel";
    gpt2.classifier_class = "GPT2ForSequenceClassification";
    gpt2.tensors = {"transformer.",
                    "transformer.wte.weight",
                    {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"},
                    {".attn.bias", ".attn.masked_bias"}};
    gpt2.size_claims = {
        {{{"vocab_size"}, "wte.weight", 0}, {{"n_embd"}, "wte.weight", 1}, {{"n_positions"}, "wpe.weight", 0}},
        {"n_layer"},
        "h."};
    gpt2.dropouts = {"resid_pdrop", "embd_pdrop", "attn_pdrop"};
    gpt2.build = build_gpt2;
    gpt2.fresh_config = fresh_gpt2;
    t.push_back(gpt2);

    DecoderArchitecture bloom;
    bloom.name = "bloom";
    bloom.display = "BLOOM";
    bloom.help = "BLOOM, ALiBi positions (HF BloomForCausalLM / BloomForSequenceClassification)";
    bloom.causal_lm_class = "BloomForCausalLM";
    bloom.classifier_class = "BloomForSequenceClassification";
    bloom.tensors = {"transformer.", "transformer.word_embeddings.weight", {}, {}};
    bloom.size_claims = {
        {{{"vocab_size"}, "word_embeddings.weight", 0}, {{"hidden_size", "n_embed"}, "word_embeddings.weight", 1}},
        {"n_layer", "num_hidden_layers"},
        "h."};
    bloom.dropouts = {"hidden_dropout", "attention_dropout"};
    bloom.build = build_bloom;
    bloom.fresh_config = fresh_bloom;
    t.push_back(bloom);

    t.push_back(llama_entry({"llama", 2048, 0, Bias::attention_bias, true, false, Window::none}, "Llama",
                            "Llama 2/3.x, SmolLM2, TinyLlama: RoPE, RMSNorm, SwiGLU, GQA (HF LlamaFor*)", "Llama"));
    t.push_back(llama_entry({"qwen2", 32768, 0, Bias::qkv, false, false, Window::qwen}, "Qwen2",
                            "Qwen2 / Qwen2.5: the Llama layout with q/k/v bias (HF Qwen2For*)", "Qwen2"));
    t.push_back(llama_entry({"qwen3", 32768, 128, Bias::attention_bias, false, true, Window::qwen}, "Qwen3",
                            "Qwen3: RMSNorm on each head's queries and keys, explicit head_dim (HF Qwen3For*)",
                            "Qwen3"));
    t.push_back(llama_entry({"mistral", 4096 * 32, 0, Bias::none, false, false, Window::uniform}, "Mistral",
                            "Mistral: the Llama layout with a sliding attention window (HF MistralFor*)", "Mistral"));
    return t;
  }();
  return table;
}

const DecoderArchitecture* find_decoder_architecture(const std::string& name) {
  for (const auto& a : decoder_architectures())
    if (a.name == name) return &a;
  return nullptr;
}

const DecoderArchitecture& decoder_architecture_of(const nlohmann::json& config, const std::string& what) {
  GA_CHECK(config.is_object(), "{}: config.json is not a JSON object", what);
  const auto* type = fields::field(config, "model_type");
  GA_CHECK(type != nullptr, "{}: config.json has no \"model_type\"", what);
  GA_CHECK(type->is_string(), "{}: config.json \"model_type\" must be a string, got {}", what, type->dump());
  const auto name = type->get<std::string>();
  if (const auto* found = find_decoder_architecture(name)) return *found;
  std::string supported;
  for (const auto& a : decoder_architectures()) supported += (supported.empty() ? "" : ", ") + a.name;
  throw Error(fmt::format("{}: config.json \"model_type\" is \"{}\"; supported: {}", what, name, supported));
}

nlohmann::json hf_config_for_task(const DecoderArchitecture& architecture, nlohmann::json config, int64_t num_labels) {
  GA_CHECK(num_labels >= 0, "{}: num_labels must be >= 0, got {}", architecture.name, num_labels);
  config["architectures"] =
      nlohmann::json::array({num_labels > 0 ? architecture.classifier_class : architecture.causal_lm_class});
  if (num_labels > 0) {
    fields::add_labels(config, num_labels);
  } else {
    config.erase("id2label");
    config.erase("label2id");
  }
  return config;
}

}  // namespace gradaccum::models
