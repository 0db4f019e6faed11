#include "gradaccum/models/gguf_checkpoint.h"

#include <filesystem>
#include <set>

#include "gradaccum/base/check.h"

namespace gradaccum::models {

namespace {

// The sizes the metadata gives a Llama model.
struct LlamaSizes {
  int64_t layers = 0, width = 0, ffn = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
};

// One tensor the metadata calls for: its GGUF and HF names, its shape, and what sizes it (for
// messages).
struct ExpectedTensor {
  std::string gguf_name, hf_name;
  std::vector<int64_t> shape;
  std::string sized_by;
  int64_t rotary_heads = 0;  // attn_q / attn_k: the heads whose rows llama.cpp interleaved
};

std::string shape_string(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

int64_t positive_size(const formats::GgufFile& file, const std::string& key) {
  const int64_t value = file.u32(key);
  GA_CHECK(value > 0, "{}: metadata key {} must be positive, got 0", file.path(), key);
  return value;
}

std::string architecture_of(const formats::GgufFile& file) {
  const std::string& architecture = file.string("general.architecture");
  GA_CHECK(architecture == "llama",
           "{}: general.architecture is \"{}\"; gradaccum reads GGUF checkpoints of architecture \"llama\" only",
           file.path(), architecture);
  return architecture;
}

LlamaSizes llama_sizes(const formats::GgufFile& file) {
  const auto& path = file.path();
  LlamaSizes s;
  s.layers = positive_size(file, "llama.block_count");
  s.width = positive_size(file, "llama.embedding_length");
  s.ffn = positive_size(file, "llama.feed_forward_length");
  s.heads = positive_size(file, "llama.attention.head_count");
  // llama.cpp's default: as many key-value heads as query heads.
  s.kv_heads =
      file.has("llama.attention.head_count_kv") ? positive_size(file, "llama.attention.head_count_kv") : s.heads;
  GA_CHECK(s.heads % s.kv_heads == 0,
           "{}: llama.attention.head_count {} is not a multiple of llama.attention.head_count_kv {}", path, s.heads,
           s.kv_heads);
  if (file.has("llama.attention.key_length")) {
    s.head_dim = positive_size(file, "llama.attention.key_length");
    if (file.has("llama.attention.value_length")) {
      const int64_t value_length = positive_size(file, "llama.attention.value_length");
      GA_CHECK(value_length == s.head_dim,
               "{}: llama.attention.value_length {} differs from llama.attention.key_length {}; a Llama head has one "
               "size",
               path, value_length, s.head_dim);
    }
  } else if (file.has("llama.rope.dimension_count")) {
    s.head_dim = positive_size(file, "llama.rope.dimension_count");
  } else {
    GA_CHECK(s.width % s.heads == 0,
             "{}: llama.embedding_length {} is not divisible by llama.attention.head_count {} (and no "
             "llama.attention.key_length gives the head size)",
             path, s.width, s.heads);
    s.head_dim = s.width / s.heads;
  }
  if (file.has("llama.rope.dimension_count")) {
    const int64_t rotary = positive_size(file, "llama.rope.dimension_count");
    GA_CHECK(rotary == s.head_dim,
             "{}: llama.rope.dimension_count {} differs from the head size {}; rotating part of a head is not "
             "supported",
             path, rotary, s.head_dim);
  }
  GA_CHECK(s.head_dim % 2 == 0,
           "{}: the head size {} (llama.attention.key_length or llama.rope.dimension_count) must "
           "be even for rotary positions",
           path, s.head_dim);
  if (file.has("llama.vocab_size")) {
    s.vocab = positive_size(file, "llama.vocab_size");
  } else if (file.has("tokenizer.ggml.tokens")) {
    s.vocab = static_cast<int64_t>(file.array_size("tokenizer.ggml.tokens"));
    GA_CHECK(s.vocab > 0, "{}: tokenizer.ggml.tokens is empty", path);
  } else {
    GA_CHECK(file.has_tensor("token_embd.weight"), "{}: no tensor token_embd.weight", path);
    const auto& shape = file.tensor("token_embd.weight").shape;
    GA_CHECK(shape.size() == 2 && shape[0] > 0, "{}: tensor token_embd.weight has shape {}, not [vocabulary, {}]", path,
             shape_string(shape), s.width);
    s.vocab = shape[0];
  }
  return s;
}

// Every tensor a Llama of these sizes has, in the file's usual order.
std::vector<ExpectedTensor> expected_tensors(const LlamaSizes& s, bool untied) {
  const int64_t q_rows = s.heads * s.head_dim, kv_rows = s.kv_heads * s.head_dim;
  const std::string width = "llama.embedding_length", ffn = "llama.feed_forward_length";
  const std::string q = "llama.attention.head_count × head size", kv = "llama.attention.head_count_kv × head size";
  const std::string vocab = "the vocabulary";
  std::vector<ExpectedTensor> t;
  t.push_back({"token_embd.weight", "model.embed_tokens.weight", {s.vocab, s.width}, vocab + ", " + width});
  for (int64_t i = 0; i < s.layers; ++i) {
    const auto blk = fmt::format("blk.{}.", i);
    const auto hf = fmt::format("model.layers.{}.", i);
    t.push_back({blk + "attn_norm.weight", hf + "input_layernorm.weight", {s.width}, width});
    t.push_back({blk + "attn_q.weight", hf + "self_attn.q_proj.weight", {q_rows, s.width}, q + ", " + width, s.heads});
    t.push_back(
        {blk + "attn_k.weight", hf + "self_attn.k_proj.weight", {kv_rows, s.width}, kv + ", " + width, s.kv_heads});
    t.push_back({blk + "attn_v.weight", hf + "self_attn.v_proj.weight", {kv_rows, s.width}, kv + ", " + width});
    t.push_back({blk + "attn_output.weight", hf + "self_attn.o_proj.weight", {s.width, q_rows}, width + ", " + q});
    t.push_back({blk + "ffn_norm.weight", hf + "post_attention_layernorm.weight", {s.width}, width});
    t.push_back({blk + "ffn_gate.weight", hf + "mlp.gate_proj.weight", {s.ffn, s.width}, ffn + ", " + width});
    t.push_back({blk + "ffn_up.weight", hf + "mlp.up_proj.weight", {s.ffn, s.width}, ffn + ", " + width});
    t.push_back({blk + "ffn_down.weight", hf + "mlp.down_proj.weight", {s.width, s.ffn}, width + ", " + ffn});
  }
  t.push_back({"output_norm.weight", "model.norm.weight", {s.width}, width});
  if (untied) t.push_back({"output.weight", "lm_head.weight", {s.vocab, s.width}, vocab + ", " + width});
  return t;
}

// The file's tensors against the expected ones: each present with its shape, nothing else.
void check_tensors(const formats::GgufFile& file, const LlamaSizes& s, const std::vector<ExpectedTensor>& expected) {
  const auto& path = file.path();
  std::set<std::string> names;
  for (const auto& e : expected) {
    names.insert(e.gguf_name);
    GA_CHECK(file.has_tensor(e.gguf_name), "{}: no tensor {} (llama.block_count is {})", path, e.gguf_name, s.layers);
    const auto& shape = file.tensor(e.gguf_name).shape;
    GA_CHECK(shape == e.shape, "{}: tensor {} has shape {}, not {} ({})", path, e.gguf_name, shape_string(shape),
             shape_string(e.shape), e.sized_by);
  }
  for (const auto& info : file.tensors()) {
    if (names.count(info.name)) continue;
    GA_CHECK(info.name != "rope_freqs.weight",
             "{}: tensor rope_freqs.weight (per-frequency RoPE factors, Llama 3.1's scaling) is not supported", path);
    throw Error(fmt::format("{}: tensor {} is not part of a llama model of {} blocks (llama.block_count)", path,
                            info.name, s.layers));
  }
}

// rope_scaling of llama.rope.scaling.* (or the older llama.rope.scale_linear); null without one.
nlohmann::json rope_scaling(const formats::GgufFile& file) {
  const auto& path = file.path();
  if (file.has("llama.rope.scaling.type")) {
    const std::string& type = file.string("llama.rope.scaling.type");
    if (type == "none") return nullptr;
    GA_CHECK(type == "linear" || type == "yarn", "{}: llama.rope.scaling.type is \"{}\"; supported: none, linear, yarn",
             path, type);
    const double factor = file.f64("llama.rope.scaling.factor");
    GA_CHECK(factor > 0, "{}: metadata key llama.rope.scaling.factor must be positive, got {}", path, factor);
    nlohmann::json scaling = {{"rope_type", type}, {"factor", factor}};
    if (type == "yarn") {
      if (file.has("llama.rope.scaling.original_context_length")) {
        scaling["original_max_position_embeddings"] = positive_size(file, "llama.rope.scaling.original_context_length");
      }
      // YaRN's ramp bounds have the same meaning in both; the keys that change its attention
      // factor or the ramp's form are refused rather than read as something else.
      for (const auto& [gguf, hf] :
           std::vector<std::pair<std::string, std::string>>{{"llama.rope.scaling.yarn_beta_fast", "beta_fast"},
                                                            {"llama.rope.scaling.yarn_beta_slow", "beta_slow"}}) {
        if (!file.has(gguf)) continue;
        const double value = file.f64(gguf);
        GA_CHECK(value > 0, "{}: metadata key {} must be positive, got {}", path, gguf, value);
        scaling[hf] = value;
      }
      for (const char* unread : {"llama.rope.scaling.attn_factor", "llama.rope.scaling.yarn_attn_factor",
                                 "llama.rope.scaling.yarn_ext_factor", "llama.rope.scaling.yarn_log_multiplier"}) {
        GA_CHECK(!file.has(unread),
                 "{}: metadata key {} is not supported (gradaccum reads YaRN's factor, original_context_length, "
                 "yarn_beta_fast and yarn_beta_slow)",
                 path, unread);
      }
    }
    return scaling;
  }
  if (file.has("llama.rope.scale_linear")) {
    const double factor = file.f64("llama.rope.scale_linear");
    GA_CHECK(factor > 0, "{}: metadata key llama.rope.scale_linear must be positive, got {}", path, factor);
    if (factor != 1.0) return {{"rope_type", "linear"}, {"factor", factor}};
  }
  return nullptr;
}

nlohmann::json config_of(const formats::GgufFile& file, const LlamaSizes& s, bool untied) {
  const auto& path = file.path();
  const double eps = file.f64("llama.attention.layer_norm_rms_epsilon");
  GA_CHECK(eps > 0, "{}: metadata key llama.attention.layer_norm_rms_epsilon must be positive, got {}", path, eps);
  const double theta = file.has("llama.rope.freq_base") ? file.f64("llama.rope.freq_base") : 10000.0;
  GA_CHECK(theta > 0, "{}: metadata key llama.rope.freq_base must be positive, got {}", path, theta);
  nlohmann::json config = {
      {"model_type", "llama"},
      {"architectures", {"LlamaForCausalLM"}},
      {"vocab_size", s.vocab},
      {"hidden_size", s.width},
      {"intermediate_size", s.ffn},
      {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"head_dim", s.head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", positive_size(file, "llama.context_length")},
      {"rms_norm_eps", eps},
      {"rope_theta", theta},
      {"tie_word_embeddings", !untied},
  };
  if (auto scaling = rope_scaling(file); !scaling.is_null()) config["rope_scaling"] = std::move(scaling);
  for (const auto& [gguf, hf] : std::vector<std::pair<std::string, std::string>>{
           {"bos", "bos_token_id"}, {"eos", "eos_token_id"}, {"padding", "pad_token_id"}}) {
    const auto key = "tokenizer.ggml." + gguf + "_token_id";
    if (!file.has(key)) continue;
    const uint64_t id = file.u64(key);
    GA_CHECK(id < static_cast<uint64_t>(s.vocab), "{}: {} is {}, beyond the vocabulary of {}", path, key, id, s.vocab);
    config[hf] = id;
  }
  return config;
}

// HF's row order for one head's rotary halves: llama.cpp stores rows (d0, d0', d1, d1', ...) of
// each head, the two halves of a rotated pair side by side; HF's rotate_half wants (d0, d1, ...,
// d0', d1', ...).
torch::Tensor rotary_rows_in_hf_order(const torch::Tensor& weight, int64_t heads) {
  const int64_t rows = weight.size(0);
  return weight.reshape({heads, rows / heads / 2, 2, -1}).transpose(1, 2).reshape(weight.sizes()).contiguous();
}

}  // namespace

bool is_gguf_path(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p(path);
  return p.extension() == ".gguf" && !std::filesystem::is_directory(p, ec);
}

nlohmann::json gguf_hf_config(const formats::GgufFile& file) {
  architecture_of(file);
  const auto sizes = llama_sizes(file);
  const bool untied = file.has_tensor("output.weight");
  check_tensors(file, sizes, expected_tensors(sizes, untied));
  return config_of(file, sizes, untied);
}

HfCheckpoint read_gguf_checkpoint(const std::string& path) {
  const auto file = formats::GgufFile::open(path);
  HfCheckpoint checkpoint;
  checkpoint.config = gguf_hf_config(file);
  const auto sizes = llama_sizes(file);
  for (const auto& e : expected_tensors(sizes, file.has_tensor("output.weight"))) {
    auto tensor = file.dequantize(e.gguf_name);
    if (e.rotary_heads > 0) tensor = rotary_rows_in_hf_order(tensor, e.rotary_heads);
    checkpoint.tensors.emplace_back(e.hf_name, std::move(tensor));
  }
  return checkpoint;
}

}  // namespace gradaccum::models
