// Hand-written matcher for GPT-2's pre-tokenizer regex. The project has no
// Unicode-aware regex library (std::regex knows neither \p{L} nor code points,
// and the Debian-packaged dependencies bring none), and this one regex is
// simple enough to run as a small state machine over code points: each
// alternative below is one branch, tried in the regex's order, and what the
// regex would backtrack over is computed directly.
#include "gradaccum/data/gpt2_pretokenizer.h"

namespace gradaccum::data {
namespace {

// Length of a contraction ('s 't 're 've 'm 'll 'd, case-sensitive) at i, or 0.
std::size_t contraction_length(std::u32string_view s, std::size_t i) {
  if (s[i] != U'\'' || i + 1 >= s.size()) return 0;
  const char32_t a = s[i + 1];
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if (i + 2 >= s.size()) return 0;
  const char32_t b = s[i + 2];
  if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  return 0;
}

// End of the run of code points of class c starting at i.
template <SpaceDefinition kSpaces>
std::size_t run_end(std::u32string_view s, std::size_t i, CharClass c) {
  while (i < s.size() && char_class(s[i], kSpaces) == c) ++i;
  return i;
}

template <SpaceDefinition kSpaces>
std::vector<TextSpan> pretokenize(std::u32string_view s) {
  std::vector<TextSpan> spans;
  spans.reserve(s.size() / 4 + 1);
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t end = i + contraction_length(s, i);
    if (end == i) {
      const CharClass here = char_class(s[i], kSpaces);
      // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional U+0020, then a
      // run of one class. The classes are disjoint, so at most one applies.
      CharClass after_space = CharClass::kSpace;
      if (s[i] == U' ' && i + 1 < s.size()) after_space = char_class(s[i + 1], kSpaces);
      if (after_space != CharClass::kSpace) {
        end = run_end<kSpaces>(s, i + 1, after_space);
      } else if (here != CharClass::kSpace) {
        end = run_end<kSpaces>(s, i, here);
      } else {
        // '\s+(?!\S)': the whitespace run, minus its last code point when a
        // non-space follows (the lookahead backtracks by one). With one space
        // before a non-space that leaves nothing, and '\s+' takes the one space.
        const std::size_t ws_end = run_end<kSpaces>(s, i, CharClass::kSpace);
        end = (ws_end < s.size() && ws_end - i >= 2) ? ws_end - 1 : ws_end;
      }
    }
    spans.push_back({i, end});
    i = end;
  }
  return spans;
}

}  // namespace

std::vector<TextSpan> gpt2_pretokenize(std::u32string_view text, SpaceDefinition spaces) {
  return spaces == SpaceDefinition::kJavaScript ? pretokenize<SpaceDefinition::kJavaScript>(text)
                                                : pretokenize<SpaceDefinition::kUnicodeWhiteSpace>(text);
}

}  // namespace gradaccum::data
