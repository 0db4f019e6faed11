// Reading the fields of a Hugging Face config.json, each error one line naming the source and
// the key. Private to models/ (hf_checkpoint.cpp, architectures.cpp).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "gradaccum/base/check.h"

namespace gradaccum::models::hf_fields {

inline const nlohmann::json* field(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  return it == config.end() ? nullptr : &*it;
}

inline int64_t required_positive_int(const nlohmann::json& config, const char* key, const std::string& what) {
  const auto* value = field(config, key);
  GA_CHECK(value != nullptr, "{}: config.json has no \"{}\"", what, key);
  GA_CHECK(value->is_number_integer(), "{}: config.json \"{}\" must be an integer, got {}", what, key, value->dump());
  const auto n = value->get<int64_t>();
  GA_CHECK(n > 0, "{}: config.json \"{}\" must be positive, got {}", what, key, n);
  return n;
}

// The first of `keys` present (HF configs renamed some fields over time).
inline int64_t required_positive_int(const nlohmann::json& config, std::initializer_list<const char*> keys,
                                     const std::string& what) {
  for (const char* key : keys)
    if (field(config, key)) return required_positive_int(config, key, what);
  return required_positive_int(config, *keys.begin(), what);  // reports the missing field
}

inline double optional_positive_number(const nlohmann::json& config, const char* key, double fallback,
                                       const std::string& what) {
  const auto* value = field(config, key);
  if (value == nullptr) return fallback;
  GA_CHECK(value->is_number(), "{}: config.json \"{}\" must be a number, got {}", what, key, value->dump());
  const auto x = value->get<double>();
  GA_CHECK(x > 0, "{}: config.json \"{}\" must be positive, got {}", what, key, x);
  return x;
}

inline double optional_probability(const nlohmann::json& config, const char* key, double fallback,
                                   const std::string& what) {
  const auto* value = field(config, key);
  if (value == nullptr) return fallback;
  GA_CHECK(value->is_number(), "{}: config.json \"{}\" must be a number, got {}", what, key, value->dump());
  const auto x = value->get<double>();
  GA_CHECK(x >= 0.0 && x < 1.0, "{}: config.json \"{}\" must be a probability in [0, 1), got {}", what, key, x);
  return x;
}

inline bool optional_bool(const nlohmann::json& config, const char* key, bool fallback, const std::string& what) {
  const auto* value = field(config, key);
  if (value == nullptr) return fallback;
  GA_CHECK(value->is_boolean(), "{}: config.json \"{}\" must be true or false, got {}", what, key, value->dump());
  return value->get<bool>();
}

// An optional setting our model supports only with one value.
inline void require_if_present(const nlohmann::json& config, const char* key, const nlohmann::json& only,
                               const std::string& what) {
  const auto* value = field(config, key);
  GA_CHECK(value == nullptr || *value == only, "{}: config.json \"{}\" is {}; this model supports only {}", what, key,
           value ? value->dump() : "", only.dump());
}

// An optional positive integer; `fallback` when absent or null.
inline int64_t optional_positive_int(const nlohmann::json& config, const char* key, int64_t fallback,
                                     const std::string& what) {
  const auto* value = field(config, key);
  if (value == nullptr || value->is_null()) return fallback;
  return required_positive_int(config, key, what);
}

// An optional string; `fallback` when absent.
inline std::string optional_string(const nlohmann::json& config, const char* key, const std::string& fallback,
                                   const std::string& what) {
  const auto* value = field(config, key);
  if (value == nullptr) return fallback;
  GA_CHECK(value->is_string(), "{}: config.json \"{}\" must be a string, got {}", what, key, value->dump());
  return value->get<std::string>();
}

// id2label / label2id for labels LABEL_0 .. LABEL_{n-1}, as HF writes them.
inline void add_labels(nlohmann::json& j, int64_t num_labels) {
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (int64_t i = 0; i < num_labels; ++i) {
    const auto label = fmt::format("LABEL_{}", i);
    id2label[std::to_string(i)] = label;
    label2id[label] = i;
  }
  j["id2label"] = id2label;
  j["label2id"] = label2id;
}

}  // namespace gradaccum::models::hf_fields
