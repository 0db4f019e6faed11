// The pre-tokenizers of Hugging Face tokenizers that byte-level BPE models use:
// they cut text into the pieces that BPE then encodes one by one.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradaccum/data/pcre2_regex.h"

namespace gradaccum::data {

// GPT-2's expression as Hugging Face's ByteLevel pre-tokenizer writes it.
inline constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// What a Split keeps of the matches and of the text between them (tokenizers'
// SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// A sequence of steps, each applied to every piece the steps before it left:
//  - Split: an expression (Oniguruma syntax, see pcre2_from_oniguruma) or a
//    literal string; its matches and the text between them become pieces as
//    the behavior says; invert swaps the two;
//  - Digits: each \p{N} character its own piece (individual_digits), or runs of them;
//  - ByteLevel: a U+0020 put before a piece that does not start with one
//    (add_prefix_space), then GPT-2's expression, Isolated (use_regex). It must
//    be the last step: what follows it in tokenizers sees byte characters.
// Empty pieces are dropped, as tokenizers does.
class PreTokenizer {
 public:
  // ByteLevel with GPT-2's expression and no prefix space: GPT-2's pre-tokenizer.
  static PreTokenizer gpt2();
  // A tokenizer.json's "pre_tokenizer" value: ByteLevel, Split, Digits, or a
  // Sequence of them ending in ByteLevel. Anything else is a gradaccum::Error
  // "tokenizer file <path>: pre_tokenizer ..." naming the step.
  static PreTokenizer from_json(const nlohmann::json& value, const std::string& path);

  // Appends the pieces of text (valid UTF-8) to pieces.
  void split(std::string_view text, std::vector<std::string>& pieces) const;

 private:
  enum class Kind { kSplit, kByteLevel };
  struct Step {
    Kind kind;
    std::optional<Pcre2Regex> regex;  // Split's, or ByteLevel's when use_regex
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
  };
  void apply(const Step& step, std::string_view piece, std::vector<std::string>& out) const;

  std::vector<Step> steps_;
};

}  // namespace gradaccum::data
