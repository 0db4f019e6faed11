// GPT-2's pre-tokenizer: splits text into the pieces that byte-level BPE then
// encodes one by one.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "gradaccum/data/unicode_tables.h"

namespace gradaccum::data {

// A piece of text: code point offsets [begin, end).
struct TextSpan {
  std::size_t begin;
  std::size_t end;
};

// Splits text as GPT-2's regex does, leftmost-first with backtracking, as run
// by JavaScript (gpt-3-encoder, js-tiktoken) with the `u` flag:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// The spans cover the text without gaps. Classes come from unicode_tables.h;
// spaces says which \s (JavaScript's by default, Hugging Face's otherwise).
std::vector<TextSpan> gpt2_pretokenize(std::u32string_view text, SpaceDefinition spaces = SpaceDefinition::kJavaScript);

}  // namespace gradaccum::data
