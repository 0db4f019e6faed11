#include "gradaccum/io/config.h"

#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>

#include "gradaccum/base/check.h"
#include "gradaccum/data/fashion_mnist.h"
#include "gradaccum/io/config_keys.h"
#include "gradaccum/io/workload.h"
#include "gradaccum/models/model_types.h"

namespace gradaccum::io {

namespace {

// Text from the user's file inside a one-line error: control bytes and bytes that are not UTF-8
// become \xNN, so a binary file given as a configuration shows what it holds without sending raw
// bytes to the terminal.
std::string printable_bytes(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    // The length of the UTF-8 sequence this byte starts (0: it starts none).
    const size_t length = byte < 0x80           ? 1
                          : (byte >> 5) == 0x6  ? 2
                          : (byte >> 4) == 0xE  ? 3
                          : (byte >> 3) == 0x1E ? 4
                                                : 0;
    bool valid = length > 0 && i + length <= text.size() && !(byte < 0x80 && (byte < 0x20 || byte == 0x7F));
    for (size_t k = 1; valid && k < length; ++k) valid = (static_cast<unsigned char>(text[i + k]) >> 6) == 0x2;
    if (valid) {
      out.append(text, i, length);
      i += length;
    } else {
      out += fmt::format("\\x{:02x}", byte);
      ++i;
    }
  }
  return out;
}

std::string describe(const YAML::Node& node) {
  if (node.IsScalar()) {
    // A whole binary file can be one scalar: its start shows what it is.
    const auto& text = node.Scalar();
    constexpr size_t kShown = 48;
    if (text.size() <= kShown) return "'" + printable_bytes(text) + "'";
    return fmt::format("'{}...' ({} bytes)", printable_bytes(text.substr(0, kShown)), text.size());
  }
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

// Merges `user` into `base`, refusing keys `base` does not have.
void merge(YAML::Node base, const YAML::Node& user, const std::string& prefix) {
  GA_CHECK(user.IsMap(), "{}: expected a mapping of keys, got {}", prefix.empty() ? "configuration" : prefix,
           describe(user));
  for (const auto& item : user) {
    GA_CHECK(item.first.IsScalar(), "{}: a key must be a name, got {}", prefix.empty() ? "configuration" : prefix,
             describe(item.first));
    const auto key = item.first.as<std::string>();
    const auto path = prefix.empty() ? key : prefix + "." + key;
    GA_CHECK(base[key].IsDefined(), "unknown key '{}'", printable_bytes(path));
    if (base[key].IsMap()) {
      merge(base[key], item.second, path);
    } else {
      base[key] = item.second;
    }
  }
}

Error malformed_yaml(const std::string& what, const YAML::Exception& e) {
  return Error(fmt::format("{}: malformed YAML at line {}, column {}: {}", what, e.mark.line + 1, e.mark.column + 1,
                           printable_bytes(e.msg)));
}

YAML::Node parse_yaml(const std::string& text, const std::string& what) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw malformed_yaml(what, e);
  }
}

// yaml-cpp keeps both entries of a key written twice in one mapping, and merging would let the
// last one win without a word: a file names each key once.
void refuse_duplicate_keys(const YAML::Node& node, const std::string& file, const std::string& prefix) {
  if (!node.IsMap()) return;
  std::map<std::string, int> first_line;
  for (const auto& item : node) {
    if (!item.first.IsScalar()) continue;  // merge() refuses it, naming it
    const auto key = item.first.Scalar();
    const auto path = prefix.empty() ? key : prefix + "." + key;
    const int line = item.first.Mark().line + 1;
    const auto [earlier, inserted] = first_line.emplace(key, line);
    GA_CHECK(inserted, "{}:{}: duplicate key '{}' (first at line {})", file, line, printable_bytes(path),
             earlier->second);
    refuse_duplicate_keys(item.second, file, path);
  }
}

// A configuration path that is not a regular file, said as what it is.
void check_configuration_file(const std::string& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  switch (status.type()) {
    case std::filesystem::file_type::regular:
      return;
    case std::filesystem::file_type::not_found:
      throw Error(fmt::format("{}: no such configuration file", path));
    case std::filesystem::file_type::directory:
      throw Error(fmt::format("{}: is a directory, not a configuration file", path));
    case std::filesystem::file_type::character:
    case std::filesystem::file_type::block:
      throw Error(fmt::format("{}: is a device, not a configuration file", path));
    default:
      break;
  }
  GA_CHECK(!error, "{}: cannot read the configuration file: {}", path, error.message());
  throw Error(fmt::format("{}: is not a regular file (a pipe or socket?), not a configuration file", path));
}

YAML::Node lookup(const YAML::Node& root, const std::string& path) {
  YAML::Node node = YAML::Clone(root);
  size_t begin = 0;
  while (true) {
    const auto dot = path.find('.', begin);
    node.reset(node[path.substr(begin, dot - begin)]);  // reset: operator= would assign through
    if (dot == std::string::npos) break;
    begin = dot + 1;
  }
  return node;
}

template <typename T>
T as(const YAML::Node& node, const std::string& path, const char* expected) {
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    throw Error(fmt::format("key '{}': expected {}, got {}", path, expected, describe(node)));
  }
}

// `value` when it is one of `allowed`, or any value when nothing is listed.
std::string one_of(const std::string& path, const std::string& value, const std::vector<std::string>& allowed) {
  GA_CHECK(allowed.empty() || std::find(allowed.begin(), allowed.end(), value) != allowed.end(),
           "key '{}': '{}' is not one of {}", path, printable_bytes(value), fmt::join(allowed, " | "));
  return value;
}

// A key's value, its type and choices checked.
KeyValue read_value(const ConfigKey& key, const YAML::Node& node) {
  switch (key.type) {
    case KeyType::integer:
      return as<int64_t>(node, key.name, "an integer");
    case KeyType::number: {
      // Every number is finite: .inf passes the >= checks (a learning rate of .inf trains
      // nothing and exits 0) and .nan fails each with a misleading rule.
      const auto number = as<double>(node, key.name, "a number");
      GA_CHECK(std::isfinite(number), "key '{}': must be a finite number, got {}", key.name, describe(node));
      return number;
    }
    case KeyType::boolean:
      return as<bool>(node, key.name, "true or false");
    case KeyType::text:
      return as<std::string>(node, key.name, "a string");
    case KeyType::choice:
      return one_of(key.name, as<std::string>(node, key.name, "a string"), key.choices);
    case KeyType::integer_list:
      return as<std::vector<int64_t>>(node, key.name, "a list of integers");
    case KeyType::names: {
      std::vector<std::string> names;
      if (node.IsSequence()) {
        for (const auto& item : node) {
          GA_CHECK(item.IsScalar(), "key '{}': expected names, got {}", key.name, describe(item));
          names.push_back(one_of(key.name, item.Scalar(), key.choices));
        }
      } else {
        GA_CHECK(node.IsScalar(), "key '{}': expected a name or a list of names, got {}", key.name, describe(node));
        names.push_back(one_of(key.name, node.Scalar(), key.choices));
      }
      return names;
    }
    case KeyType::section:
      break;
  }
  throw Error(fmt::format("key '{}': a section has no value", key.name));
}

std::string show(const KeyValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&value)) return fmt::format("{}", *d);
  if (const auto* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&value)) return "'" + printable_bytes(*s) + "'";
  return "a list";
}

void require(bool ok, const std::string& path, const std::string& rule, const std::string& got) {
  GA_CHECK(ok, "key '{}': must be {}, got {}", path, rule, got);
}

// The rules that tie keys together, after every key has passed its own.
void check_combinations(TrainConfig& c) {
  auto& t = c.trainer;
  require(!c.output_dir.empty(), "output_dir", "a directory", "''");
  const auto& data = data_type(c.data.type);
  const bool language_model =
      models::model_type(c.model.type).family == models::ModelFamily::language || !c.model.hf_checkpoint.empty();
  const bool text_data = data.family == models::ModelFamily::language;
  GA_CHECK(text_data == language_model, "key 'data.type': {} data needs {} (model.type is {})", c.data.type,
           text_data ? "a language model: model.type gpt2 or bloom, or model.hf_checkpoint"
                     : "an image model: model.type mlp, cnn or resnet",
           c.model.type);
  GA_CHECK(c.data.type != "text" || !c.data.path.empty(), "key 'data.path': data.type text needs a file");
  if (!c.model.hf_checkpoint.empty()) {
    std::error_code error;
    const auto parent = std::filesystem::path(c.model.hf_checkpoint).parent_path();
    GA_CHECK(!std::filesystem::is_regular_file(c.model.hf_checkpoint, error) ||
                 std::filesystem::path(c.model.hf_checkpoint).extension() == ".gguf",
             "key 'model.hf_checkpoint': {} is a file; give the directory that holds config.json and "
             "model.safetensors ({}), or a .gguf file",
             c.model.hf_checkpoint, parent.empty() ? "." : parent.string());
  }
  if (!language_model && c.model.norm == models::NormKind::group) {
    // A group norm over `width` channels splits them into norm_groups groups, or one channel per
    // group where the width is below norm_groups; any other width would fall back to gcd(width,
    // norm_groups) groups (7 groups over 32 channels: 1) without a word.
    const bool mlp = c.model.type == "mlp";
    const auto& widths = mlp ? c.model.hidden : c.model.channels;
    const int64_t groups = c.model.norm_groups;
    for (const int64_t width : widths) {
      GA_CHECK(width < 1 || width % groups == 0 || groups % width == 0,
               "key 'model.norm_groups': {} groups do not divide the width {} in model.{} (group norm needs "
               "norm_groups to divide each width, or each width to divide it)",
               groups, width, mlp ? "hidden" : "channels");
    }
  }
  const bool random_tokens = c.data.type == "random_tokens";
  if (random_tokens) {
    require(c.data.vocab_size >= 2, "data.vocab_size", ">= 2 with data.type random_tokens",
            std::to_string(c.data.vocab_size));
  } else {
    require(c.data.vocab_size == 0, "data.vocab_size", "0 unless data.type is random_tokens (the tokenizer's)",
            std::to_string(c.data.vocab_size));
  }
  GA_CHECK(!random_tokens || c.sample.prompt.empty(),
           "key 'sample.prompt': data.type random_tokens has no tokenizer to encode a prompt; leave it \"\"");
  require(!t.optimizer.nesterov || t.optimizer.momentum > 0, "nesterov", "false unless momentum > 0", "true");
  if (c.plan_decomposition) {
    GA_CHECK(t.global_batch_size > 0,
             "key 'per_device_train_batch_size': auto plans a decomposition of global_batch_size; set "
             "global_batch_size (> 0)");
  }
  GA_CHECK(!t.deterministic_accumulation || (!c.sync_each_micro_step && c.zero_stage == 0),
           "key 'deterministic_accumulation': reduces across ranks in its own tree order; it cannot be "
           "combined with sync_each_micro_step or zero_stage: 1, 2 or 3");
  GA_CHECK(!c.sync_each_micro_step || c.zero_stage < 2,
           "key 'sync_each_micro_step': zero_stage: {} reduces by sharded_grad_sync; set "
           "sharded_grad_sync=each_micro_step instead",
           c.zero_stage);
  GA_CHECK(c.zero_stage >= 2 || c.sharded_grad_sync == dist::GradShardPolicy::automatic,
           "key 'sharded_grad_sync': it applies to zero_stage: 2 and 3 only, and zero_stage is {}", c.zero_stage);
}

// The trainer's options as the configuration names them (core::validate's messages).
const core::OptionNames& key_names() {
  static const core::OptionNames names({}, "key");
  return names;
}

// Values that default to another key's.
void resolve_defaults(TrainConfig& c) {
  if (c.data.directory.empty()) c.data.directory = data::kFashionMnistDir;
  if (c.logging_dir.empty()) c.logging_dir = (std::filesystem::path(c.output_dir) / "runs").string();
  // ZeRO-2's ranks hold shards of the gradients, not the parameters' whole gradients.
  if (c.trainer.grad_flow_steps == -1) c.trainer.grad_flow_steps = c.zero_stage >= 2 ? 0 : c.logging_steps;
}

}  // namespace

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides, int64_t world_size) {
  YAML::Node root = YAML::Load(default_config_yaml());
  if (!path.empty()) {
    check_configuration_file(path);
    YAML::Node user;
    try {
      user = YAML::LoadFile(path);
    } catch (const YAML::Exception& e) {
      throw malformed_yaml(path, e);
    }
    refuse_duplicate_keys(user, path, "");
    if (!user.IsNull()) merge(root, user, "");
  }
  for (const auto& assignment : overrides) {
    const auto eq = assignment.find('=');
    GA_CHECK(eq != std::string::npos && eq > 0, "--set '{}': expected key=value", assignment);
    const auto key = assignment.substr(0, eq);
    // The key becomes YAML text below, so it must not carry YAML syntax of its own.
    for (size_t i = 0; i < key.size(); ++i) {
      const char ch = key[i];
      const bool name = std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
      const bool dot = ch == '.' && i > 0 && i + 1 < key.size() && key[i + 1] != '.';
      GA_CHECK(name || dot, "--set '{}': a key is names of letters, digits and '_' joined by '.'", key);
    }
    // Build {a: {b: value}} for "a.b=value" and merge it like a file.
    std::string yaml_text;
    std::string indent;
    size_t begin = 0;
    while (true) {
      const auto dot = key.find('.', begin);
      yaml_text += indent + key.substr(begin, dot - begin) + ":";
      if (dot == std::string::npos) break;
      yaml_text += "\n";
      indent += "  ";
      begin = dot + 1;
    }
    // "--set key=" (or key="" after the shell) means the empty string, not YAML's null.
    const auto text = assignment.substr(eq + 1);
    auto value = text.empty() ? YAML::Node(std::string()) : parse_yaml(text, fmt::format("--set {}", key));
    YAML::Node patch = parse_yaml(yaml_text, fmt::format("--set {}", key));
    YAML::Node leaf = patch;
    begin = 0;
    while (true) {
      const auto dot = key.find('.', begin);
      const auto part = key.substr(begin, dot - begin);
      if (dot == std::string::npos) {
        leaf[part] = value;
        break;
      }
      leaf.reset(leaf[part]);
      begin = dot + 1;
    }
    merge(root, patch, "");
  }

  TrainConfig c;
  for (const auto& key : config_keys()) {
    if (key.type == KeyType::section) continue;
    const auto node = lookup(root, key.name);
    if (key.allows_auto && node.IsScalar() && node.Scalar() == "auto") {
      // `auto`: the decomposition of global_batch_size is planned at start-up (cli/plan_command.h);
      // until then it is 1.
      c.plan_decomposition = true;
      key.store(c, int64_t{1});
      root[key.name] = 1;
      continue;
    }
    const auto value = read_value(key, node);
    if (key.valid) {
      require(key.valid(value), key.name, key.rule_here ? key.rule + key.rule_here() : key.rule, show(value));
    }
    key.store(c, value);
  }
  if (c.plan_decomposition) c.trainer.gradient_accumulation_steps = 1;  // N follows from b and the global batch
  check_combinations(c);
  resolve_defaults(c);
  auto& t = c.trainer;

  // The rules that tie the trainer's options together, and the GA arithmetic, must hold before
  // anything runs: these throw naming the keys and the numbers.
  core::validate(t, world_size, key_names());
  const auto geometry = t.geometry(world_size);
  root["gradient_accumulation_steps"] = geometry.accumulation_steps();
  t.gradient_accumulation_steps = geometry.accumulation_steps();

  YAML::Emitter out;
  out << root;
  c.resolved_yaml = std::string(out.c_str()) + "\n";
  return c;
}

}  // namespace gradaccum::io
