// The configuration's keys, each spelled once: one ConfigKey per key holds its name, type,
// default, rule and help. From this table come the built-in default YAML, what a file or
// `--set` may name, the checks and their one-line errors, and the configuration reference
// (docs/config.md, `gradaccum config --reference`). Rules that tie several keys together are
// checked after every key is read (io/config.cpp, `check_combinations`).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "gradaccum/io/config.h"

namespace gradaccum::io {

enum class KeyType {
  integer,       // int64
  number,        // double
  boolean,       // true | false
  text,          // any string
  choice,        // one of `choices`
  integer_list,  // [a, b, ...]
  names,         // one of `choices` (any name when there are none), or a list of them
  section,       // a mapping whose keys follow in the table ("model", "data", ...)
};

// A key's value after its type is checked: the alternative its KeyType names.
using KeyValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<std::string>>;

struct ConfigKey {
  std::string name;  // dotted path: "model.n_layer"
  KeyType type = KeyType::text;
  std::string default_yaml;          // its value in the default configuration, as YAML text
  std::string help;                  // one line: the default YAML's comment and the reference's text
  std::vector<std::string> choices;  // choice and names
  // What a valid value is, for errors ("key 'k': must be <rule>, got v") and the reference;
  // `valid` null: every value of the type.
  std::string rule;
  std::function<bool(const KeyValue&)> valid;
  // A rule whose bound depends on the machine (threads): that bound here, for its errors; the
  // rule's text, in the reference, stays the same on every machine.
  std::function<std::string()> rule_here;
  bool allows_auto = false;  // `auto` is a value too (per_device_train_batch_size, ...)
  // Stores a checked value in the configuration (not called for `auto`).
  std::function<void(TrainConfig&, const KeyValue&)> store;
};

// Every key, sections before their keys, in the default configuration's order.
const std::vector<ConfigKey>& config_keys();

// The key named `name` (dotted), or null.
const ConfigKey* find_config_key(const std::string& name);

// The configuration reference in Markdown, generated from the table (docs/config.md).
std::string config_reference_markdown();

}  // namespace gradaccum::io
