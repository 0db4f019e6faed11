// A tokenizer.json's normalizer: the Unicode normalization forms (NFC, NFD, NFKC, NFKD), alone or
// in a Sequence, as Hugging Face tokenizers applies them to the text between added tokens before
// pre-tokenization (Qwen2's files use NFC). The forms come from utf8proc (Debian's
// libutf8proc-dev), not from tables of our own.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradaccum::data {

class Normalizer {
 public:
  // The normalizer a tokenizer.json's "normalizer" value describes; nullopt for null (none).
  // Another kind (Lowercase, Replace, BertNormalizer, ...) is a gradaccum::Error naming `path`.
  static std::optional<Normalizer> from_json(const nlohmann::json& spec, const std::string& path);

  // `text` (valid UTF-8) in each form in turn.
  std::string apply(std::string_view text) const;
  // True when apply() would return `text` unchanged for certain: ASCII is in every form.
  static bool leaves_alone(std::string_view text);

 private:
  std::vector<int> forms_;  // utf8proc option sets, in order
};

}  // namespace gradaccum::data
