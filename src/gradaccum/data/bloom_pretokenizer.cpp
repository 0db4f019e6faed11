// Hand-written for the same reason as gpt2_pretokenizer.cpp: no Unicode regex
// library; this one pattern is a character class and an optional space.
#include "gradaccum/data/bloom_pretokenizer.h"

#include "gradaccum/data/unicode_tables.h"

namespace gradaccum::data {
namespace {

bool is_separator(char32_t c) {
  switch (c) {
    case U'(':
    case U')':
    case U'|':
    case U'.':
    case U',':
    case U'!':
    case U'?':
    case U'\u2026':
    case U'\u3002':
    case U'\uFF0C':
    case U'\u3001':
    case U'\u0964':
    case U'\u06D4':
    case U'\u060C':
      return true;
    default:
      return char_class(c, SpaceDefinition::kUnicodeWhiteSpace) == CharClass::kSpace;
  }
}

}  // namespace

std::vector<TextSpan> bloom_pretokenize(std::u32string_view s) {
  std::vector<TextSpan> spans;
  std::size_t gap_begin = 0;  // start of the separators since the last word
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t word_begin = i;
    if (s[i] == U' ' && i + 1 < s.size() && !is_separator(s[i + 1])) {
      ++i;
    } else if (is_separator(s[i])) {
      ++i;  // no match here: part of the gap
      continue;
    }
    while (i < s.size() && !is_separator(s[i])) ++i;
    if (gap_begin < word_begin) spans.push_back({gap_begin, word_begin});
    spans.push_back({word_begin, i});
    gap_begin = i;
  }
  if (gap_begin < s.size()) spans.push_back({gap_begin, s.size()});
  return spans;
}

}  // namespace gradaccum::data
