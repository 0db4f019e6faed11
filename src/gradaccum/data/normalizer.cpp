#include "gradaccum/data/normalizer.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "gradaccum/base/check.h"

namespace gradaccum::data {
namespace {

std::optional<int> form_options(const std::string& type) {
  if (type == "NFC") return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
  if (type == "NFD") return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
  if (type == "NFKC") return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  if (type == "NFKD") return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  return std::nullopt;
}

std::string type_of(const nlohmann::json& spec) {
  return spec.is_object() && spec.contains("type") && spec["type"].is_string() ? spec["type"].get<std::string>()
                                                                               : spec.dump().substr(0, 40);
}

void add_forms(const nlohmann::json& spec, const std::string& path, std::vector<int>& forms, int depth) {
  GA_CHECK(depth < 8, "tokenizer file {}: normalizer Sequences nested more than 8 deep", path);
  const std::string type = type_of(spec);
  if (type == "Sequence") {
    GA_CHECK(spec.contains("normalizers") && spec["normalizers"].is_array(),
             "tokenizer file {}: normalizer Sequence without a \"normalizers\" array", path);
    for (const auto& inner : spec["normalizers"]) add_forms(inner, path, forms, depth + 1);
    return;
  }
  const auto options = form_options(type);
  GA_CHECK(options.has_value(), "tokenizer file {}: normalizer {} is not supported (NFC, NFD, NFKC, NFKD, Sequence)",
           path, type);
  forms.push_back(*options);
}

}  // namespace

std::optional<Normalizer> Normalizer::from_json(const nlohmann::json& spec, const std::string& path) {
  if (spec.is_null()) return std::nullopt;
  Normalizer normalizer;
  add_forms(spec, path, normalizer.forms_, 0);
  if (normalizer.forms_.empty()) return std::nullopt;  // an empty Sequence
  return normalizer;
}

bool Normalizer::leaves_alone(std::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string out(text);
  if (leaves_alone(out)) return out;
  for (const int options : forms_) {
    utf8proc_uint8_t* mapped = nullptr;
    // With the length given, a NUL byte is a character like any other.
    const utf8proc_ssize_t length =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(out.data()), static_cast<utf8proc_ssize_t>(out.size()),
                     &mapped, static_cast<utf8proc_option_t>(options));
    const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(mapped, &std::free);
    GA_CHECK(length >= 0, "tokenizer normalizer: {}", utf8proc_errmsg(length));
    out.assign(reinterpret_cast<const char*>(mapped), static_cast<std::size_t>(length));
  }
  return out;
}

}  // namespace gradaccum::data
