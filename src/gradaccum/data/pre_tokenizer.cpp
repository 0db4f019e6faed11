#include "gradaccum/data/pre_tokenizer.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "gradaccum/base/check.h"

namespace gradaccum::data {
namespace {

using nlohmann::json;

std::string step_type(const json& step) {
  return step.is_object() && step.contains("type") && step["type"].is_string() ? step["type"].get<std::string>()
                                                                               : std::string("?");
}

// A literal string as a PCRE2 expression: ASCII punctuation and controls
// escaped with a backslash (always literal in PCRE2), the rest as it is.
std::string literal_pattern(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto b = static_cast<unsigned char>(c);
    const bool alphanumeric = (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z');
    if (b < 0x80 && !alphanumeric) out += '\\';
    out += c;
  }
  return out;
}

SplitBehavior read_behavior(const json& split, const std::string& path) {
  static const std::pair<const char*, SplitBehavior> kNames[] = {
      {"Removed", SplitBehavior::kRemoved},
      {"Isolated", SplitBehavior::kIsolated},
      {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
      {"MergedWithNext", SplitBehavior::kMergedWithNext},
      {"Contiguous", SplitBehavior::kContiguous}};
  const json behavior = split.value("behavior", json());
  for (const auto& [name, value] : kNames) {
    if (behavior.is_string() && behavior.get<std::string>() == name) return value;
  }
  throw Error(fmt::format(
      "tokenizer file {}: pre_tokenizer Split behavior {} is not one of Removed, Isolated, MergedWithPrevious, "
      "MergedWithNext, Contiguous",
      path, behavior.dump(-1, ' ', false, json::error_handler_t::replace)));
}

const Pcre2Regex& gpt2_regex() {
  static const Pcre2Regex regex(pcre2_from_oniguruma(kGpt2Pattern, "GPT-2's pre-tokenizer pattern"),
                                "GPT-2's pre-tokenizer pattern", kGpt2Pattern);
  return regex;
}

// Appends the Split pieces of text to out, as tokenizers' NormalizedString::split
// does with the matches of regex (none when null).
void split_text(std::string_view text, const Pcre2Regex* regex, SplitBehavior behavior, bool invert,
                std::vector<std::string>& out) {
  if (text.empty()) return;  // tokenizers drops empty pieces
  if (behavior == SplitBehavior::kIsolated && !invert) {
    // Matches and the text between them, each a piece: the common case, direct.
    std::size_t previous = 0;
    if (regex != nullptr) {
      regex->for_each_match(text, [&](std::size_t begin, std::size_t end) {
        if (previous < begin) out.emplace_back(text.substr(previous, begin - previous));
        if (begin < end) out.emplace_back(text.substr(begin, end - begin));
        previous = end;
      });
    }
    if (previous < text.size()) out.emplace_back(text.substr(previous));
    return;
  }
  struct Part {
    std::size_t begin, end;
    bool is_match;
  };
  std::vector<Part> parts;
  std::size_t previous = 0;
  if (regex != nullptr) {
    regex->for_each_match(text, [&](std::size_t begin, std::size_t end) {
      if (previous != begin) parts.push_back({previous, begin, false});
      parts.push_back({begin, end, true});
      previous = end;
    });
  }
  if (previous != text.size()) parts.push_back({previous, text.size(), false});
  if (invert) {
    for (Part& part : parts) part.is_match = !part.is_match;
  }
  // Each entry: [begin, end) and whether it is removed.
  std::vector<Part> splits;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& part : parts) splits.push_back({part.begin, part.end, false});
      break;
    case SplitBehavior::kRemoved:
      splits = parts;
      break;
    case SplitBehavior::kContiguous:
      for (const Part& part : parts) {
        if (part.is_match == previous_match && !splits.empty()) {
          splits.back().end = part.end;
        } else {
          splits.push_back({part.begin, part.end, false});
        }
        previous_match = part.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& part : parts) {
        if (part.is_match && !previous_match && !splits.empty()) {
          splits.back().end = part.end;
        } else {
          splits.push_back({part.begin, part.end, false});
        }
        previous_match = part.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !splits.empty()) {
          splits.back().begin = it->begin;
        } else {
          splits.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(splits.begin(), splits.end());
      break;
  }
  for (const Part& split : splits) {
    if (!split.is_match && split.begin < split.end) out.emplace_back(text.substr(split.begin, split.end - split.begin));
  }
}

}  // namespace

PreTokenizer PreTokenizer::gpt2() {
  PreTokenizer pre;
  pre.steps_.push_back({Kind::kByteLevel, gpt2_regex()});
  return pre;
}

PreTokenizer PreTokenizer::from_json(const json& value, const std::string& path) {
  GA_CHECK(!value.is_null(), "tokenizer file {}: no pre_tokenizer (only byte-level BPE is supported)", path);
  std::vector<const json*> steps;
  // Sequences may nest; their steps run in order either way.
  const std::function<void(const json&)> flatten = [&](const json& step) {
    if (step_type(step) != "Sequence") {
      steps.push_back(&step);
      return;
    }
    GA_CHECK(step.contains("pretokenizers") && step["pretokenizers"].is_array(),
             "tokenizer file {}: pre_tokenizer Sequence has no pretokenizers array", path);
    for (const json& inner : step["pretokenizers"]) flatten(inner);
  };
  flatten(value);

  PreTokenizer pre;
  for (const json* step_json : steps) {
    const json& step = *step_json;
    const std::string type = step_type(step);
    GA_CHECK(pre.steps_.empty() || pre.steps_.back().kind != Kind::kByteLevel,
             "tokenizer file {}: pre_tokenizer step {} follows ByteLevel, which must be the last step (the steps "
             "after it see byte characters)",
             path, type);
    if (type == "ByteLevel") {
      Step byte_level{Kind::kByteLevel, std::nullopt};
      if (step.value("use_regex", true)) byte_level.regex = gpt2_regex();
      byte_level.add_prefix_space = step.value("add_prefix_space", false);
      pre.steps_.push_back(std::move(byte_level));
    } else if (type == "Split") {
      Step split{Kind::kSplit, std::nullopt};
      const json pattern = step.value("pattern", json());
      const std::string what = fmt::format("tokenizer file {}: pre_tokenizer Split pattern", path);
      if (pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex") && pattern["Regex"].is_string()) {
        const std::string expression = pattern["Regex"].get<std::string>();
        split.regex.emplace(pcre2_from_oniguruma(expression, what), what, expression);
      } else if (pattern.is_object() && pattern.size() == 1 && pattern.contains("String") &&
                 pattern["String"].is_string()) {
        // tokenizers finds an empty string nowhere (an empty expression would match everywhere).
        const std::string literal = pattern["String"].get<std::string>();
        if (!literal.empty()) split.regex.emplace(literal_pattern(literal), what, literal);
      } else {
        throw Error(
            fmt::format("tokenizer file {}: pre_tokenizer Split needs a pattern {{\"Regex\": ...}} or "
                        "{{\"String\": ...}}",
                        path));
      }
      split.behavior = read_behavior(step, path);
      split.invert = step.value("invert", false);
      pre.steps_.push_back(std::move(split));
    } else if (type == "Digits") {
      // tokenizers splits at Rust's char::is_numeric, Unicode's Nd, Nl and No.
      static const Pcre2Regex digit("\\p{N}", "the Digits pattern");
      Step digits{Kind::kSplit, digit};
      digits.behavior = step.value("individual_digits", false) ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
      pre.steps_.push_back(std::move(digits));
    } else {
      throw Error(fmt::format(
          "tokenizer file {}: pre_tokenizer step {} is not supported (only ByteLevel, Split, Digits and Sequence)",
          path, type));
    }
  }
  GA_CHECK(!pre.steps_.empty() && pre.steps_.back().kind == Kind::kByteLevel,
           "tokenizer file {}: pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)", path);
  return pre;
}

void PreTokenizer::apply(const Step& step, std::string_view piece, std::vector<std::string>& out) const {
  const Pcre2Regex* regex = step.regex ? &*step.regex : nullptr;
  if (step.kind == Kind::kSplit) {
    split_text(piece, regex, step.behavior, step.invert, out);
    return;
  }
  // ByteLevel adds the space to each piece it receives, before its own expression.
  std::string prefixed;
  if (step.add_prefix_space && (piece.empty() || piece.front() != ' ')) {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  if (regex == nullptr) {
    if (!piece.empty()) out.emplace_back(piece);
    return;
  }
  split_text(piece, regex, SplitBehavior::kIsolated, false, out);
}

void PreTokenizer::split(std::string_view text, std::vector<std::string>& pieces) const {
  if (text.empty()) return;
  if (steps_.size() == 1) {
    apply(steps_[0], text, pieces);
    return;
  }
  std::vector<std::string> current{std::string(text)}, next;
  for (const Step& step : steps_) {
    next.clear();
    for (const std::string& piece : current) apply(step, piece, next);
    current.swap(next);
  }
  for (std::string& piece : current) pieces.push_back(std::move(piece));
}

}  // namespace gradaccum::data
