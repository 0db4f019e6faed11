#include "gradaccum/data/added_token_split.h"

#include <algorithm>

#include "gradaccum/data/pcre2_regex.h"
#include "gradaccum/data/unicode_tables.h"
#include "gradaccum/data/utf8.h"

namespace gradaccum::data {
namespace {

// Rust's char::is_whitespace: Unicode's White_Space.
bool is_white_space(char32_t c) { return char_class(c, SpaceDefinition::kUnicodeWhiteSpace) == CharClass::kSpace; }

// Rust's char::is_alphanumeric (Alphabetic or Numeric), or '_': what tokenizers
// counts as a word character around a single_word token.
bool is_word_character(std::string_view character) {
  static const Pcre2Regex word("^[\\p{Alphabetic}\\p{N}_]", "the single_word character class");
  return word.find(character, 0).has_value();
}

bool is_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The last character of text (non-empty valid UTF-8).
std::string_view last_character(std::string_view text) {
  std::size_t begin = text.size() - 1;
  while (begin > 0 && is_continuation(text[begin])) --begin;
  return text.substr(begin);
}

std::string_view first_character(std::string_view text) {
  std::size_t end = 1;
  while (end < text.size() && is_continuation(text[end])) ++end;
  return text.substr(0, end);
}

char32_t code_point(std::string_view character) { return decode_utf8(character).front(); }

// Where the White_Space that ends text begins (text.size() when none).
std::size_t trailing_space_begin(std::string_view text) {
  std::size_t begin = text.size();
  while (begin > 0) {
    const std::string_view c = last_character(text.substr(0, begin));
    if (!is_white_space(code_point(c))) break;
    begin -= c.size();
  }
  return begin;
}

// Bytes of the White_Space that starts text.
std::size_t leading_space_length(std::string_view text) {
  std::size_t end = 0;
  while (end < text.size()) {
    const std::string_view c = first_character(text.substr(end));
    if (!is_white_space(code_point(c))) break;
    end += c.size();
  }
  return end;
}

}  // namespace

AddedTokenSplitter::AddedTokenSplitter(const std::vector<AddedToken>& tokens) {
  for (const AddedToken& token : tokens) (token.normalized ? normalized_ : non_normalized_).add(token);
  non_normalized_.finish();
  normalized_.finish();
}

void AddedTokenSplitter::Matcher::add(const AddedToken& token) {
  by_first_byte_[static_cast<unsigned char>(token.content.front())].push_back(tokens_.size());
  tokens_.push_back(token);
}

void AddedTokenSplitter::Matcher::finish() {
  for (auto& candidates : by_first_byte_) {
    std::stable_sort(candidates.begin(), candidates.end(), [&](std::size_t a, std::size_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

void AddedTokenSplitter::Matcher::split(std::string_view text, std::vector<TextSection>& sections) const {
  std::size_t section_begin = 0;  // tokenizers' start_offset
  std::size_t i = 0;
  while (i < text.size()) {
    const AddedToken* found = nullptr;
    for (std::size_t index : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const AddedToken& token = tokens_[index];
      if (text.compare(i, token.content.size(), token.content) == 0) {
        found = &token;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    std::size_t begin = i, end = i + found->content.size();
    i = end;  // the search goes on after the match, whatever is made of it
    if (found->single_word) {
      const bool word_before = begin > 0 && is_word_character(last_character(text.substr(0, begin)));
      const bool word_after = end < text.size() && is_word_character(first_character(text.substr(end)));
      if (word_before || word_after) continue;
    }
    if (found->lstrip) begin = std::max(trailing_space_begin(text.substr(0, begin)), section_begin);
    if (found->rstrip) end += leading_space_length(text.substr(end));
    if (begin < section_begin) continue;  // inside the space an rstrip token took
    if (section_begin < begin) sections.push_back({text.substr(section_begin, begin - section_begin), std::nullopt});
    sections.push_back({{}, found->id});
    section_begin = end;
  }
  if (section_begin < text.size()) sections.push_back({text.substr(section_begin), std::nullopt});
}

void AddedTokenSplitter::split(std::string_view text, std::vector<TextSection>& sections,
                               const Normalize* normalize) const {
  if (normalized_.empty() && normalize == nullptr) {
    non_normalized_.split(text, sections);
    return;
  }
  std::vector<TextSection> first;
  non_normalized_.split(text, first);
  for (const TextSection& section : first) {
    if (section.id) {
      sections.push_back(section);
      continue;
    }
    const std::string_view normal = normalize != nullptr ? (*normalize)(section.text) : section.text;
    if (normalized_.empty()) {
      sections.push_back({normal, std::nullopt});
    } else {
      normalized_.split(normal, sections);
    }
  }
}

}  // namespace gradaccum::data
