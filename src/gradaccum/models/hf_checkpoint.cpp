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
#include <set>
#include <sstream>

#include "gradaccum/base/check.h"
#include "gradaccum/base/files.h"
#include "gradaccum/models/architectures.h"
#include "gradaccum/models/hf_config_fields.h"

namespace gradaccum::models {

namespace fs = std::filesystem;

namespace {

// The heads' name of the backbone (decoder.h), and the untied LM head's parameter.
const std::string kModulePrefix = "transformer.";
const std::string kHeadName = "lm_head.weight";

// The architecture table's (architectures.h) rules for `architecture`.
const HfTensorNames& rules_for(const std::string& architecture) {
  if (const auto* found = find_decoder_architecture(architecture)) return found->tensors;
  std::string known;
  for (const auto& a : decoder_architectures()) known += (known.empty() ? "" : ", ") + a.name;
  throw Error(fmt::format("HF checkpoint: unknown architecture \"{}\" (expected one of {})", architecture, known));
}

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool has_prefix(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

bool is_transposed(const HfTensorNames& rules, const std::string& name) {
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

// A module's parameter name for checkpoint tensor `name`: the family's backbone prefix (HF's
// `model.`) read as the module's `transformer.`, and names with or without a backbone prefix
// (checkpoints of the bare backbone); empty when there is none.
std::string parameter_name(const ModuleParameters& params, const HfTensorNames& rules, const std::string& name) {
  auto known = [&](const std::string& n) { return params.own.count(n) > 0 || params.alias_of.count(n) > 0; };
  if (known(name)) return name;
  if (has_prefix(name, rules.hf_prefix) && known(kModulePrefix + name.substr(rules.hf_prefix.size())))
    return kModulePrefix + name.substr(rules.hf_prefix.size());
  if (known(kModulePrefix + name)) return kModulePrefix + name;
  if (has_prefix(name, kModulePrefix) && known(name.substr(kModulePrefix.size())))
    return name.substr(kModulePrefix.size());
  return {};
}

// The checkpoint's name of module parameter `name`: `transformer.` becomes the family's prefix.
std::string hf_name(const HfTensorNames& rules, const std::string& name) {
  return has_prefix(name, kModulePrefix) ? rules.hf_prefix + name.substr(kModulePrefix.size()) : name;
}

// The tensor named `name` with or without the family's file prefix ("transformer.", "model."),
// or null.
const std::pair<std::string, torch::Tensor>* tensor_named(const formats::NamedTensors& tensors, const std::string& name,
                                                          const std::string& prefix) {
  for (const auto& item : tensors) {
    if (item.first == name || item.first == prefix + name) return &item;
  }
  return nullptr;
}

// How many blocks the tensors hold: one more than the largest i of "<block_prefix><i>." (with or
// without the file prefix).
int64_t blocks_held(const formats::NamedTensors& tensors, const std::string& block_prefix, const std::string& prefix) {
  int64_t blocks = 0;
  for (const auto& item : tensors) {
    std::string name = item.first;
    if (has_prefix(name, prefix)) name = name.substr(prefix.size());
    if (!has_prefix(name, block_prefix)) continue;
    const auto dot = name.find('.', block_prefix.size());
    const auto index =
        name.substr(block_prefix.size(), dot == std::string::npos ? std::string::npos : dot - block_prefix.size());
    if (index.empty() || index.size() > 9 || index.find_first_not_of("0123456789") != std::string::npos) continue;
    blocks = std::max<int64_t>(blocks, std::stoll(index) + 1);
  }
  return blocks;
}

// What config.json claims against what the checkpoint's tensors hold (the architecture's
// size_claims), checked before a model of the claimed size is built: a config.json edited to
// 100000 layers or a vocabulary of 10^12 beside a small model.safetensors is one line naming the
// key, not gigabytes allocated before libtorch's allocator gives up. Keys that are absent or not
// integers are left to the config conversion, which names them.
void check_claims_against_tensors(const nlohmann::json& config, const formats::NamedTensors& tensors,
                                  const std::string& config_file, const std::string& weights_file) {
  const auto* type = hf_fields::field(config, "model_type");
  if (type == nullptr || !type->is_string()) return;
  const auto* architecture = find_decoder_architecture(type->get<std::string>());
  if (architecture == nullptr) return;
  const auto& claims = architecture->size_claims;
  const auto& prefix = architecture->tensors.hf_prefix;
  // The first of `keys` that config.json holds as an integer, with the name it has there.
  auto claimed = [&](const std::vector<std::string>& keys) -> std::pair<std::string, std::optional<int64_t>> {
    for (const auto& key : keys) {
      if (const auto* value = hf_fields::field(config, key.c_str())) {
        if (!value->is_number_integer()) break;
        return {key, value->get<int64_t>()};
      }
    }
    return {keys.empty() ? std::string() : keys.front(), std::nullopt};
  };
  for (const auto& claim : claims.dimensions) {
    const auto [key, value] = claimed(claim.keys);
    if (!value) continue;
    const auto* held = tensor_named(tensors, claim.tensor, prefix);
    GA_CHECK(held != nullptr, "{}: it has no tensor {} (or {}{}), so config.json's \"{}\" {} is unchecked",
             weights_file, claim.tensor, prefix, claim.tensor, key, *value);
    const auto& sizes = held->second.sizes();
    GA_CHECK(sizes.size() == 2 && sizes[static_cast<size_t>(claim.dim)] == *value,
             "{}: \"{}\" is {}, but {} holds {} of shape {}", config_file, key, *value, weights_file, held->first,
             shape_string(sizes));
  }
  if (claims.layer_keys.empty()) return;
  const auto [layer_key, layers] = claimed(claims.layer_keys);
  const int64_t blocks = blocks_held(tensors, claims.block_prefix, prefix);
  GA_CHECK(
      !layers || *layers == blocks, "{}: \"{}\" is {}, but {} holds {} blocks{}", config_file, layer_key, *layers,
      weights_file, blocks,
      blocks > 0 ? fmt::format(" ({}0 to {}{})", claims.block_prefix, claims.block_prefix, blocks - 1) : std::string());
}

// The tensors of a sharded checkpoint: model.safetensors.index.json's "weight_map" names each
// tensor's shard (a file beside it); every shard is read once, and a tensor the index lists
// that its shard lacks, or a shard's tensor the index does not list, is an error.
std::vector<std::pair<std::string, torch::Tensor>> read_shards(const fs::path& root, const fs::path& index_path) {
  const auto index = read_json_file(index_path.string());
  const std::string what = index_path.string();
  GA_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
           "{}: has no \"weight_map\" object", what);
  std::map<std::string, std::set<std::string>> listed;  // shard -> its tensors
  for (const auto& [name, file] : index["weight_map"].items()) {
    GA_CHECK(file.is_string(), "{}: \"weight_map\" entry {} must name a file, got {}", what, name, file.dump());
    const auto shard = file.get<std::string>();
    GA_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
             "{}: \"weight_map\" entry {} names {}, not a file beside the index", what, name, file.dump());
    listed[shard].insert(name);
  }
  GA_CHECK(!listed.empty(), "{}: \"weight_map\" lists no tensor", what);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [shard, names] : listed) {
    const fs::path path = root / shard;
    GA_CHECK(fs::exists(path), "{}: shard {} (of tensor {}) does not exist", what, shard, *names.begin());
    for (auto& item : formats::load_safetensors(path.string())) {
      GA_CHECK(names.erase(item.first) == 1, "{}: tensor {} is not listed in {}", path.string(), item.first, what);
      tensors.push_back(std::move(item));
    }
    GA_CHECK(names.empty(), "{}: lists tensor {} in shard {}, which does not hold it", what, *names.begin(), shard);
  }
  return tensors;
}

}  // namespace

nlohmann::json read_json_file(const std::string& file) {
  const fs::path path(file);
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

HfCheckpoint read_hf_checkpoint(const std::string& dir) {
  const fs::path root(dir);
  GA_CHECK(fs::is_directory(root), "{}: HF checkpoint directory does not exist", dir);
  const fs::path config_path = root / "config.json";
  GA_CHECK(fs::exists(config_path), "{}: HF checkpoint has no config.json", dir);
  const fs::path weights = root / "model.safetensors";
  const fs::path index = root / "model.safetensors.index.json";
  if (!fs::exists(weights) && fs::exists(index)) {
    HfCheckpoint checkpoint;
    checkpoint.config = read_json_file(fs::path(config_path).string());
    GA_CHECK(checkpoint.config.is_object(), "{}: not a JSON object", config_path.string());
    checkpoint.tensors = read_shards(root, index);
    check_claims_against_tensors(checkpoint.config, checkpoint.tensors, config_path.string(), index.string());
    return checkpoint;
  }
  if (!fs::exists(weights)) {
    GA_CHECK(!fs::exists(root / "pytorch_model.bin"),
             "{}: has only pytorch_model.bin; convert it to model.safetensors (pickle files are "
             "not read)",
             dir);
    throw Error(fmt::format("{}: HF checkpoint has no model.safetensors", dir));
  }
  HfCheckpoint checkpoint;
  checkpoint.config = read_json_file(fs::path(config_path).string());
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
    base::write_file_atomically((staging / "config.json").string(), checkpoint.config.dump(2) + "\n");
    formats::save_safetensors((staging / "model.safetensors").string(), checkpoint.tensors);
    base::fsync_directory(staging.string());
    base::replace_directory(staging.string(), target.string());
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
      if (name == kHeadName && !head_source.empty()) {
        // A tied head HF saved anyway: it must at least fit the embedding.
        const auto& source =
            params.own.count(head_source) ? params.own.at(head_source) : params.own.at(params.alias_of.at(head_source));
        GA_CHECK(tensor.sizes() == source.sizes(), "{}: tensor {}: shape {} does not match the tied {} {}", what, name,
                 shape_string(tensor.sizes()), hf_name(rules, head_source), shape_string(source.sizes()));
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
               shape_string(tensor.sizes()), hf_name(rules, params.alias_of.at(target)), shape_string(source.sizes()));
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
    GA_CHECK(inserted, "{}: tensors {} and {} both hold parameter {}", what, it->second.first, name,
             hf_name(rules, target));
  }

  std::vector<std::string> missing;
  for (const auto& name : params.order) {
    if (assigned.count(name) == 0 &&
        std::find(may_be_missing.begin(), may_be_missing.end(), name) == may_be_missing.end())
      missing.push_back(hf_name(rules, name));
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

std::vector<std::pair<std::string, torch::Tensor>> hf_tensors(
    torch::nn::Module& module, const std::string& architecture,
    const std::function<bool(const std::string& name, const torch::Tensor& parameter)>& keep) {
  const auto& rules = rules_for(architecture);
  const auto params = module_parameters(module);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& name : params.order) {
    if (keep && !keep(name, params.own.at(name))) continue;
    auto t = params.own.at(name).detach();
    if (is_transposed(rules, name)) t = t.t();
    out.emplace_back(hf_name(rules, name), t.to(torch::kCPU).contiguous().clone());
  }
  return out;
}

std::string hf_name_of(const std::string& architecture, const std::string& name) {
  return hf_name(rules_for(architecture), name);
}

std::string hf_model_type(const nlohmann::json& config, const std::string& what) {
  return decoder_architecture_of(config, what).name;
}

int64_t hf_num_labels(const nlohmann::json& config, const std::string& what) {
  GA_CHECK(config.is_object(), "{}: config.json is not a JSON object", what);
  const auto* architectures = hf_fields::field(config, "architectures");
  if (architectures == nullptr || architectures->is_null()) return 0;
  GA_CHECK(architectures->is_array() && architectures->size() == 1 && (*architectures)[0].is_string(),
           "{}: config.json \"architectures\" must be a list of one class name, got {}", what, architectures->dump());
  const auto name = (*architectures)[0].get<std::string>();
  if (!has_suffix(name, "ForSequenceClassification")) return 0;
  if (const auto* id2label = hf_fields::field(config, "id2label")) {
    GA_CHECK(id2label->is_object() && !id2label->empty(),
             "{}: config.json \"id2label\" must be a non-empty object, got {}", what, id2label->dump());
    return static_cast<int64_t>(id2label->size());
  }
  if (hf_fields::field(config, "num_labels")) return hf_fields::required_positive_int(config, "num_labels", what);
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
  if (num_labels > 0) hf_fields::add_labels(j, num_labels);
  return j;
}

Gpt2Config gpt2_config_from_hf(const nlohmann::json& config, const std::string& what) {
  GA_CHECK(hf_model_type(config, what) == "gpt2", "{}: config.json \"model_type\" is \"{}\", not \"gpt2\"", what,
           config["model_type"].get<std::string>());
  Gpt2Config c;
  c.vocab_size = hf_fields::required_positive_int(config, "vocab_size", what);
  c.n_positions = hf_fields::required_positive_int(config, "n_positions", what);
  c.n_embd = hf_fields::required_positive_int(config, "n_embd", what);
  c.n_layer = hf_fields::required_positive_int(config, "n_layer", what);
  c.n_head = hf_fields::required_positive_int(config, "n_head", what);
  GA_CHECK(c.n_embd % c.n_head == 0, "{}: config.json \"n_embd\" {} is not divisible by \"n_head\" {}", what, c.n_embd,
           c.n_head);
  c.layer_norm_epsilon = hf_fields::optional_positive_number(config, "layer_norm_epsilon", 1e-5, what);
  c.initializer_range = hf_fields::optional_positive_number(config, "initializer_range", 0.02, what);
  c.init_seed = 0;

  // gelu_pytorch_tanh is the same function as gelu_new (the tanh approximation).
  if (const auto* act = hf_fields::field(config, "activation_function")) {
    GA_CHECK(*act == "gelu_new" || *act == "gelu_pytorch_tanh",
             "{}: config.json \"activation_function\" is {}; this model supports only \"gelu_new\"", what, act->dump());
  }
  if (const auto* inner = hf_fields::field(config, "n_inner"); inner != nullptr && !inner->is_null()) {
    GA_CHECK(*inner == 4 * c.n_embd,
             "{}: config.json \"n_inner\" is {}; this model supports only null or 4 * n_embd = {}", what, inner->dump(),
             4 * c.n_embd);
  }
  c.tie_word_embeddings = hf_fields::optional_bool(config, "tie_word_embeddings", true, what);
  // HF's GPT2Config defaults when absent.
  c.resid_pdrop = hf_fields::optional_probability(config, "resid_pdrop", 0.1, what);
  c.embd_pdrop = hf_fields::optional_probability(config, "embd_pdrop", 0.1, what);
  c.attn_pdrop = hf_fields::optional_probability(config, "attn_pdrop", 0.1, what);
  hf_fields::require_if_present(config, "scale_attn_weights", true, what);
  hf_fields::require_if_present(config, "scale_attn_by_inverse_layer_idx", false, what);
  hf_fields::require_if_present(config, "add_cross_attention", false, what);
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
  if (num_labels > 0) hf_fields::add_labels(j, num_labels);
  return j;
}

BloomConfig bloom_config_from_hf(const nlohmann::json& config, const std::string& what) {
  GA_CHECK(hf_model_type(config, what) == "bloom", "{}: config.json \"model_type\" is \"{}\", not \"bloom\"", what,
           config["model_type"].get<std::string>());
  BloomConfig c;
  c.vocab_size = hf_fields::required_positive_int(config, "vocab_size", what);
  c.hidden_size = hf_fields::required_positive_int(config, {"hidden_size", "n_embed"}, what);
  c.n_layer = hf_fields::required_positive_int(config, {"n_layer", "num_hidden_layers"}, what);
  c.n_head = hf_fields::required_positive_int(config, {"n_head", "num_attention_heads"}, what);
  GA_CHECK(c.hidden_size % c.n_head == 0, "{}: config.json \"hidden_size\" {} is not divisible by \"n_head\" {}", what,
           c.hidden_size, c.n_head);
  c.layer_norm_epsilon = hf_fields::optional_positive_number(config, "layer_norm_epsilon", 1e-5, what);
  c.initializer_range = hf_fields::optional_positive_number(config, "initializer_range", 0.02, what);
  c.init_seed = 0;
  hf_fields::require_if_present(config, "apply_residual_connection_post_layernorm", false, what);
  c.tie_word_embeddings = hf_fields::optional_bool(config, "tie_word_embeddings", true, what);
  // HF's BloomConfig defaults when absent.
  c.hidden_dropout = hf_fields::optional_probability(config, "hidden_dropout", 0.0, what);
  c.attention_dropout = hf_fields::optional_probability(config, "attention_dropout", 0.0, what);
  return c;
}

}  // namespace gradaccum::models
