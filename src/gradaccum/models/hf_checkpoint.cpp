#include "gradaccum/models/hf_checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <sstream>

#include "gradaccum/base/check.h"

namespace gradaccum::models {

namespace fs = std::filesystem;

namespace {

// What differs between a module's named_parameters() and HF's tensors.
struct ArchitectureRules {
  // The backbone's attribute name in HF's head classes (base_model_prefix).
  std::string base_prefix = "transformer.";
  // The tied LM head and the parameter it shares.
  std::string tied_head = "lm_head.weight";
  std::string tied_to;
  // Parameter name suffixes whose HF tensor is the transpose of ours.
  std::vector<std::string> transposed;
  // Name suffixes of non-parameter buffers that checkpoints may carry.
  std::vector<std::string> ignored;
};

const ArchitectureRules& rules_for(const std::string& architecture) {
  static const ArchitectureRules gpt2{
      "transformer.",
      "lm_head.weight",
      "transformer.wte.weight",
      {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"},
      {".attn.bias", ".attn.masked_bias"}};
  static const ArchitectureRules bloom{"transformer.", "lm_head.weight", "transformer.word_embeddings.weight", {}, {}};
  if (architecture == "gpt2") return gpt2;
  if (architecture == "bloom") return bloom;
  throw Error(fmt::format("HF checkpoint: unknown architecture \"{}\" (expected gpt2 or bloom)", architecture));
}

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool has_prefix(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

bool is_transposed(const ArchitectureRules& rules, const std::string& name) {
  return std::any_of(rules.transposed.begin(), rules.transposed.end(),
                     [&](const std::string& suffix) { return has_suffix(name, suffix); });
}

std::string shape_string(torch::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

// The parameters of `module`, split into the ones that own their tensor and
// the ones that are the same tensor as an earlier one (a tied head registered
// twice), mapped to that earlier name.
struct ModuleParameters {
  std::map<std::string, torch::Tensor> own;
  std::map<std::string, std::string> alias_of;
  std::vector<std::string> order;  // own names in registration order
};

ModuleParameters module_parameters(torch::nn::Module& module) {
  ModuleParameters result;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const auto& tensor = item.value();
    std::string earlier;
    for (const auto& name : result.order) {
      const auto& other = result.own.at(name);
      if (tensor.numel() > 0 && other.data_ptr() == tensor.data_ptr() && other.sizes() == tensor.sizes())
        earlier = name;
    }
    if (!earlier.empty()) {
      result.alias_of[item.key()] = earlier;
    } else {
      result.own[item.key()] = tensor;
      result.order.push_back(item.key());
    }
  }
  return result;
}

// A module's parameter name for checkpoint tensor `name`, with or without the
// backbone prefix; empty when there is none.
std::string parameter_name(const ModuleParameters& params, const ArchitectureRules& rules, const std::string& name) {
  auto known = [&](const std::string& n) { return params.own.count(n) > 0 || params.alias_of.count(n) > 0; };
  if (known(name)) return name;
  if (known(rules.base_prefix + name)) return rules.base_prefix + name;
  if (has_prefix(name, rules.base_prefix) && known(name.substr(rules.base_prefix.size())))
    return name.substr(rules.base_prefix.size());
  return {};
}

const nlohmann::json* field(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  return it == config.end() ? nullptr : &*it;
}

int64_t required_positive_int(const nlohmann::json& config, const char* key, const std::string& what) {
  const auto* value = field(config, key);
  GA_CHECK(value != nullptr, "{}: config.json has no \"{}\"", what, key);
  GA_CHECK(value->is_number_integer(), "{}: config.json \"{}\" must be an integer, got {}", what, key, value->dump());
  const auto n = value->get<int64_t>();
  GA_CHECK(n > 0, "{}: config.json \"{}\" must be positive, got {}", what, key, n);
  return n;
}

// The first of `keys` present (HF configs renamed some fields over time).
int64_t required_positive_int(const nlohmann::json& config, std::initializer_list<const char*> keys,
                              const std::string& what) {
  for (const char* key : keys)
    if (field(config, key)) return required_positive_int(config, key, what);
  return required_positive_int(config, *keys.begin(), what);  // reports the missing field
}

double optional_positive_number(const nlohmann::json& config, const char* key, double fallback,
                                const std::string& what) {
  const auto* value = field(config, key);
  if (value == nullptr) return fallback;
  GA_CHECK(value->is_number(), "{}: config.json \"{}\" must be a number, got {}", what, key, value->dump());
  const auto x = value->get<double>();
  GA_CHECK(x > 0, "{}: config.json \"{}\" must be positive, got {}", what, key, x);
  return x;
}

double optional_probability(const nlohmann::json& config, const char* key, double fallback, const std::string& what) {
  const auto* value = field(config, key);
  if (value == nullptr) return fallback;
  GA_CHECK(value->is_number(), "{}: config.json \"{}\" must be a number, got {}", what, key, value->dump());
  const auto x = value->get<double>();
  GA_CHECK(x >= 0.0 && x < 1.0, "{}: config.json \"{}\" must be a probability in [0, 1), got {}", what, key, x);
  return x;
}

bool optional_bool(const nlohmann::json& config, const char* key, bool fallback, const std::string& what) {
  const auto* value = field(config, key);
  if (value == nullptr) return fallback;
  GA_CHECK(value->is_boolean(), "{}: config.json \"{}\" must be true or false, got {}", what, key, value->dump());
  return value->get<bool>();
}

// An optional setting our model supports only with one value.
void require_if_present(const nlohmann::json& config, const char* key, const nlohmann::json& only,
                        const std::string& what) {
  const auto* value = field(config, key);
  GA_CHECK(value == nullptr || *value == only, "{}: config.json \"{}\" is {}; this model supports only {}", what, key,
           value ? value->dump() : "", only.dump());
}

nlohmann::json read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  GA_CHECK(in.good(), "{}: cannot read", path.string());
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    std::string message = e.what();
    std::replace(message.begin(), message.end(), '\n', ' ');
    throw Error(fmt::format("{}: not valid JSON: {}", path.string(), message));
  }
}

// The tensor named `name` with or without the backbone prefix "transformer.", or null.
const std::pair<std::string, torch::Tensor>* tensor_named(const formats::NamedTensors& tensors,
                                                          const std::string& name) {
  for (const auto& item : tensors) {
    if (item.first == name || item.first == "transformer." + name) return &item;
  }
  return nullptr;
}

// How many transformer blocks the tensors hold: one more than the largest N of "h.N." (with or
// without the backbone prefix).
int64_t blocks_held(const formats::NamedTensors& tensors) {
  int64_t blocks = 0;
  for (const auto& item : tensors) {
    std::string name = item.first;
    if (has_prefix(name, "transformer.")) name = name.substr(std::string("transformer.").size());
    if (!has_prefix(name, "h.")) continue;
    const auto dot = name.find('.', 2);
    const auto index = name.substr(2, dot == std::string::npos ? std::string::npos : dot - 2);
    if (index.empty() || index.size() > 9 || index.find_first_not_of("0123456789") != std::string::npos) continue;
    blocks = std::max<int64_t>(blocks, std::stoll(index) + 1);
  }
  return blocks;
}

// What config.json claims against what model.safetensors holds, checked before a model of the
// claimed size is built: a config.json edited to 100000 layers or a vocabulary of 10^12 beside a
// small model.safetensors is one line naming the key, not gigabytes allocated before libtorch's
// allocator gives up. Keys that are absent or not integers are left to the config conversion,
// which names them.
void check_claims_against_tensors(const nlohmann::json& config, const formats::NamedTensors& tensors,
                                  const std::string& config_file, const std::string& weights_file) {
  const auto* type = field(config, "model_type");
  if (type == nullptr || !type->is_string() || (*type != "gpt2" && *type != "bloom")) return;
  const bool gpt2 = *type == "gpt2";
  // The first of `keys` that config.json holds as an integer, with the name it has there.
  auto claimed = [&](std::initializer_list<const char*> keys) -> std::pair<const char*, std::optional<int64_t>> {
    for (const char* key : keys) {
      if (const auto* value = field(config, key)) {
        if (!value->is_number_integer()) break;
        return {key, value->get<int64_t>()};
      }
    }
    return {*keys.begin(), std::nullopt};
  };
  auto check_dimension = [&](std::initializer_list<const char*> keys, const std::string& tensor, int64_t dim) {
    const auto [key, value] = claimed(keys);
    if (!value) return;
    const auto* held = tensor_named(tensors, tensor);
    GA_CHECK(held != nullptr, "{}: it has no tensor {} (or transformer.{}), so config.json's \"{}\" {} is unchecked",
             weights_file, tensor, tensor, key, *value);
    const auto& sizes = held->second.sizes();
    GA_CHECK(sizes.size() == 2 && sizes[static_cast<size_t>(dim)] == *value,
             "{}: \"{}\" is {}, but {} holds {} of shape {}", config_file, key, *value, weights_file, held->first,
             shape_string(sizes));
  };
  const std::string embedding = gpt2 ? "wte.weight" : "word_embeddings.weight";
  check_dimension({"vocab_size"}, embedding, 0);
  if (gpt2) {
    check_dimension({"n_embd"}, embedding, 1);
    check_dimension({"n_positions"}, "wpe.weight", 0);
  } else {
    check_dimension({"hidden_size", "n_embed"}, embedding, 1);
  }
  const auto [layer_key, layers] = claimed(gpt2 ? std::initializer_list<const char*>{"n_layer"}
                                                : std::initializer_list<const char*>{"n_layer", "num_hidden_layers"});
  const int64_t blocks = blocks_held(tensors);
  GA_CHECK(!layers || *layers == blocks, "{}: \"{}\" is {}, but {} holds {} blocks{}", config_file, layer_key, *layers,
           weights_file, blocks, blocks > 0 ? fmt::format(" (h.0 to h.{})", blocks - 1) : std::string());
}

}  // namespace

HfCheckpoint read_hf_checkpoint(const std::string& dir) {
  const fs::path root(dir);
  GA_CHECK(fs::is_directory(root), "{}: HF checkpoint directory does not exist", dir);
  const fs::path config_path = root / "config.json";
  GA_CHECK(fs::exists(config_path), "{}: HF checkpoint has no config.json", dir);
  const fs::path weights = root / "model.safetensors";
  if (!fs::exists(weights)) {
    GA_CHECK(!fs::exists(root / "model.safetensors.index.json"),
             "{}: sharded checkpoints (model.safetensors.index.json) are not supported", dir);
    GA_CHECK(!fs::exists(root / "pytorch_model.bin"),
             "{}: has only pytorch_model.bin; convert it to model.safetensors (pickle files are "
             "not read)",
             dir);
    throw Error(fmt::format("{}: HF checkpoint has no model.safetensors", dir));
  }
  HfCheckpoint checkpoint;
  checkpoint.config = read_json_file(config_path);
  GA_CHECK(checkpoint.config.is_object(), "{}: not a JSON object", config_path.string());
  checkpoint.tensors = formats::load_safetensors(weights.string());
  check_claims_against_tensors(checkpoint.config, checkpoint.tensors, config_path.string(), weights.string());
  return checkpoint;
}

void write_hf_checkpoint(const std::string& dir, const HfCheckpoint& checkpoint) {
  GA_CHECK(checkpoint.config.is_object(), "{}: HF config must be a JSON object", dir);
  fs::path target(dir);
  if (!target.has_filename()) target = target.parent_path();  // "out/ckpt/" → "out/ckpt"
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::path staging = target.string() + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::create_directories(parent, ec);
  fs::remove_all(staging, ec);  // a leftover of an earlier crash of this pid
  GA_CHECK(fs::create_directory(staging, ec), "{}: cannot create {}: {}", dir, staging.string(), ec.message());
  try {
    formats::write_file_atomically_fsync((staging / "config.json").string(), checkpoint.config.dump(2) + "\n");
    formats::save_safetensors((staging / "model.safetensors").string(), checkpoint.tensors);
    formats::fsync_directory(staging.string());
    if (fs::exists(target)) {
      // Linux swaps the two directories in one step (renameat2 RENAME_EXCHANGE);
      // where the filesystem cannot, the old one is moved aside first, leaving a
      // moment without `dir`.
      if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
        fs::remove_all(staging, ec);  // now the old checkpoint
      } else {
        const fs::path old = target.string() + ".old-" + std::to_string(::getpid());
        fs::remove_all(old, ec);
        GA_CHECK(std::rename(target.c_str(), old.c_str()) == 0, "{}: cannot move the old checkpoint aside to {}", dir,
                 old.string());
        if (std::rename(staging.c_str(), target.c_str()) != 0) {
          std::rename(old.c_str(), target.c_str());
          throw Error(fmt::format("{}: cannot rename {} to it", dir, staging.string()));
        }
        fs::remove_all(old, ec);
      }
    } else {
      GA_CHECK(std::rename(staging.c_str(), target.c_str()) == 0, "{}: cannot rename {} to it", dir, staging.string());
    }
    formats::fsync_directory(parent.string());
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

void load_hf_tensors(torch::nn::Module& module, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                     const std::string& architecture, const std::string& what,
                     const std::vector<std::string>& may_be_missing) {
  const auto& rules = rules_for(architecture);
  const auto params = module_parameters(module);

  // Checkpoint tensor for each own parameter, validated before anything is copied.
  std::map<std::string, std::pair<std::string, torch::Tensor>> assigned;
  for (const auto& item : tensors) {
    const std::string& name = item.first;
    const torch::Tensor& tensor = item.second;
    std::string target = parameter_name(params, rules, name);
    if (target.empty()) {
      const std::string head_source = parameter_name(params, rules, rules.tied_to);
      if (name == rules.tied_head && !head_source.empty()) {
        // A tied head HF saved anyway: it must at least fit the embedding.
        const auto& source =
            params.own.count(head_source) ? params.own.at(head_source) : params.own.at(params.alias_of.at(head_source));
        GA_CHECK(tensor.sizes() == source.sizes(), "{}: tensor {}: shape {} does not match the tied {} {}", what, name,
                 shape_string(tensor.sizes()), head_source, shape_string(source.sizes()));
        continue;
      }
      const bool ignored = std::any_of(rules.ignored.begin(), rules.ignored.end(),
                                       [&](const std::string& s) { return has_suffix(name, s); });
      if (ignored) continue;
      throw Error(
          fmt::format("{}: unexpected tensor {}: the {} model has no such parameter", what, name, architecture));
    }
    if (params.alias_of.count(target)) {
      const auto& source = params.own.at(params.alias_of.at(target));
      GA_CHECK(tensor.sizes() == source.sizes(), "{}: tensor {}: shape {} does not match the tied {} {}", what, name,
               shape_string(tensor.sizes()), params.alias_of.at(target), shape_string(source.sizes()));
      continue;
    }
    const auto& param = params.own.at(target);
    std::vector<int64_t> expected = param.sizes().vec();
    if (is_transposed(rules, target)) std::reverse(expected.begin(), expected.end());
    GA_CHECK(tensor.sizes() == torch::IntArrayRef(expected), "{}: tensor {}: shape {} does not match the model's {}{}",
             what, name, shape_string(tensor.sizes()), shape_string(expected),
             is_transposed(rules, target) ? " (HF Conv1D layout [in, out])" : "");
    GA_CHECK(tensor.is_floating_point() || !param.is_floating_point(), "{}: tensor {}: dtype {} is not floating point",
             what, name, c10::toString(tensor.scalar_type()));
    auto [it, inserted] = assigned.emplace(target, std::make_pair(name, tensor));
    GA_CHECK(inserted, "{}: tensors {} and {} both hold parameter {}", what, it->second.first, name, target);
  }

  std::vector<std::string> missing;
  for (const auto& name : params.order) {
    if (assigned.count(name) == 0 &&
        std::find(may_be_missing.begin(), may_be_missing.end(), name) == may_be_missing.end())
      missing.push_back(name);
  }
  if (!missing.empty()) {
    throw Error(fmt::format("{}: missing tensor {}{}", what, missing.front(),
                            missing.size() > 1 ? fmt::format(" (and {} more)", missing.size() - 1) : std::string()));
  }

  torch::NoGradGuard no_grad;
  for (auto& [target, source] : assigned) {
    auto param = params.own.at(target);
    const auto& tensor = source.second;
    // copy_ converts dtype and device; the parameter keeps its own.
    param.copy_(is_transposed(rules, target) ? tensor.t() : tensor);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> hf_tensors(torch::nn::Module& module,
                                                              const std::string& architecture) {
  const auto& rules = rules_for(architecture);
  const auto params = module_parameters(module);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& name : params.order) {
    auto t = params.own.at(name).detach();
    if (is_transposed(rules, name)) t = t.t();
    out.emplace_back(name, t.to(torch::kCPU).contiguous().clone());
  }
  return out;
}

// id2label / label2id for labels LABEL_0 .. LABEL_{n-1}, as HF writes them.
void add_labels(nlohmann::json& j, int64_t num_labels) {
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (int64_t i = 0; i < num_labels; ++i) {
    const auto label = fmt::format("LABEL_{}", i);
    id2label[std::to_string(i)] = label;
    label2id[label] = i;
  }
  j["id2label"] = id2label;
  j["label2id"] = label2id;
}

std::string hf_model_type(const nlohmann::json& config, const std::string& what) {
  GA_CHECK(config.is_object(), "{}: config.json is not a JSON object", what);
  const auto* type = field(config, "model_type");
  GA_CHECK(type != nullptr, "{}: config.json has no \"model_type\"", what);
  GA_CHECK(type->is_string(), "{}: config.json \"model_type\" must be a string, got {}", what, type->dump());
  const auto name = type->get<std::string>();
  GA_CHECK(name == "gpt2" || name == "bloom", "{}: config.json \"model_type\" is \"{}\"; supported: gpt2, bloom", what,
           name);
  return name;
}

int64_t hf_num_labels(const nlohmann::json& config, const std::string& what) {
  GA_CHECK(config.is_object(), "{}: config.json is not a JSON object", what);
  const auto* architectures = field(config, "architectures");
  if (architectures == nullptr || architectures->is_null()) return 0;
  GA_CHECK(architectures->is_array() && architectures->size() == 1 && (*architectures)[0].is_string(),
           "{}: config.json \"architectures\" must be a list of one class name, got {}", what, architectures->dump());
  const auto name = (*architectures)[0].get<std::string>();
  if (!has_suffix(name, "ForSequenceClassification")) return 0;
  if (const auto* id2label = field(config, "id2label")) {
    GA_CHECK(id2label->is_object() && !id2label->empty(),
             "{}: config.json \"id2label\" must be a non-empty object, got {}", what, id2label->dump());
    return static_cast<int64_t>(id2label->size());
  }
  if (field(config, "num_labels")) return required_positive_int(config, "num_labels", what);
  return 2;  // PretrainedConfig's default
}

nlohmann::json gpt2_hf_config(const Gpt2Config& config, int64_t num_labels) {
  GA_CHECK(num_labels >= 0, "gpt2_hf_config: num_labels must be >= 0, got {}", num_labels);
  nlohmann::json j = {
      {"model_type", "gpt2"},
      {"architectures", {num_labels > 0 ? "GPT2ForSequenceClassification" : "GPT2LMHeadModel"}},
      {"vocab_size", config.vocab_size},
      {"n_positions", config.n_positions},
      {"n_embd", config.n_embd},
      {"n_layer", config.n_layer},
      {"n_head", config.n_head},
      {"n_inner", nullptr},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", config.layer_norm_epsilon},
      {"initializer_range", config.initializer_range},
      {"resid_pdrop", config.resid_pdrop},
      {"embd_pdrop", config.embd_pdrop},
      {"attn_pdrop", config.attn_pdrop},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", config.tie_word_embeddings},
      {"use_cache", true},
  };
  if (config.vocab_size == 50257) {  // GPT-2's BPE: <|endoftext|> is both
    j["bos_token_id"] = 50256;
    j["eos_token_id"] = 50256;
  }
  if (num_labels > 0) add_labels(j, num_labels);
  return j;
}

Gpt2Config gpt2_config_from_hf(const nlohmann::json& config, const std::string& what) {
  GA_CHECK(hf_model_type(config, what) == "gpt2", "{}: config.json \"model_type\" is \"{}\", not \"gpt2\"", what,
           config["model_type"].get<std::string>());
  Gpt2Config c;
  c.vocab_size = required_positive_int(config, "vocab_size", what);
  c.n_positions = required_positive_int(config, "n_positions", what);
  c.n_embd = required_positive_int(config, "n_embd", what);
  c.n_layer = required_positive_int(config, "n_layer", what);
  c.n_head = required_positive_int(config, "n_head", what);
  GA_CHECK(c.n_embd % c.n_head == 0, "{}: config.json \"n_embd\" {} is not divisible by \"n_head\" {}", what, c.n_embd,
           c.n_head);
  c.layer_norm_epsilon = optional_positive_number(config, "layer_norm_epsilon", 1e-5, what);
  c.initializer_range = optional_positive_number(config, "initializer_range", 0.02, what);
  c.init_seed = 0;

  // gelu_pytorch_tanh is the same function as gelu_new (the tanh approximation).
  if (const auto* act = field(config, "activation_function")) {
    GA_CHECK(*act == "gelu_new" || *act == "gelu_pytorch_tanh",
             "{}: config.json \"activation_function\" is {}; this model supports only \"gelu_new\"", what, act->dump());
  }
  if (const auto* inner = field(config, "n_inner"); inner != nullptr && !inner->is_null()) {
    GA_CHECK(*inner == 4 * c.n_embd,
             "{}: config.json \"n_inner\" is {}; this model supports only null or 4 * n_embd = {}", what, inner->dump(),
             4 * c.n_embd);
  }
  c.tie_word_embeddings = optional_bool(config, "tie_word_embeddings", true, what);
  // HF's GPT2Config defaults when absent.
  c.resid_pdrop = optional_probability(config, "resid_pdrop", 0.1, what);
  c.embd_pdrop = optional_probability(config, "embd_pdrop", 0.1, what);
  c.attn_pdrop = optional_probability(config, "attn_pdrop", 0.1, what);
  require_if_present(config, "scale_attn_weights", true, what);
  require_if_present(config, "scale_attn_by_inverse_layer_idx", false, what);
  require_if_present(config, "add_cross_attention", false, what);
  return c;
}

nlohmann::json bloom_hf_config(const BloomConfig& config, int64_t num_labels) {
  GA_CHECK(num_labels >= 0, "bloom_hf_config: num_labels must be >= 0, got {}", num_labels);
  nlohmann::json j = {
      {"model_type", "bloom"},
      {"architectures", {num_labels > 0 ? "BloomForSequenceClassification" : "BloomForCausalLM"}},
      {"vocab_size", config.vocab_size},
      {"hidden_size", config.hidden_size},
      {"n_layer", config.n_layer},
      {"n_head", config.n_head},
      {"layer_norm_epsilon", config.layer_norm_epsilon},
      {"initializer_range", config.initializer_range},
      {"apply_residual_connection_post_layernorm", false},
      {"hidden_dropout", config.hidden_dropout},
      {"attention_dropout", config.attention_dropout},
      {"pretraining_tp", 1},
      {"slow_but_exact", false},
      {"tie_word_embeddings", config.tie_word_embeddings},
      {"use_cache", true},
  };
  if (config.vocab_size == 250880) {  // BLOOM's tokenizer: <s> 1, </s> 2, <pad> 3
    j["bos_token_id"] = 1;
    j["eos_token_id"] = 2;
    j["pad_token_id"] = 3;
  }
  if (num_labels > 0) add_labels(j, num_labels);
  return j;
}

BloomConfig bloom_config_from_hf(const nlohmann::json& config, const std::string& what) {
  GA_CHECK(hf_model_type(config, what) == "bloom", "{}: config.json \"model_type\" is \"{}\", not \"bloom\"", what,
           config["model_type"].get<std::string>());
  BloomConfig c;
  c.vocab_size = required_positive_int(config, "vocab_size", what);
  c.hidden_size = required_positive_int(config, {"hidden_size", "n_embed"}, what);
  c.n_layer = required_positive_int(config, {"n_layer", "num_hidden_layers"}, what);
  c.n_head = required_positive_int(config, {"n_head", "num_attention_heads"}, what);
  GA_CHECK(c.hidden_size % c.n_head == 0, "{}: config.json \"hidden_size\" {} is not divisible by \"n_head\" {}", what,
           c.hidden_size, c.n_head);
  c.layer_norm_epsilon = optional_positive_number(config, "layer_norm_epsilon", 1e-5, what);
  c.initializer_range = optional_positive_number(config, "initializer_range", 0.02, what);
  c.init_seed = 0;
  require_if_present(config, "apply_residual_connection_post_layernorm", false, what);
  c.tie_word_embeddings = optional_bool(config, "tie_word_embeddings", true, what);
  // HF's BloomConfig defaults when absent.
  c.hidden_dropout = optional_probability(config, "hidden_dropout", 0.0, what);
  c.attention_dropout = optional_probability(config, "attention_dropout", 0.0, what);
  return c;
}

}  // namespace gradaccum::models
