// BLOOM's pre-tokenizer: its tokenizer.json splits the text with one regex
// before a ByteLevel step that does no further splitting.
#pragma once

#include <string_view>
#include <vector>

#include "gradaccum/data/gpt2_pretokenizer.h"

namespace gradaccum::data {

// The Split pattern of BLOOM's tokenizer.json (behavior "Isolated").
inline constexpr std::string_view kBloomSplitPattern = " ?[^(\\s|[.,!?…。，、।۔،])]+";

// Splits text as Hugging Face tokenizers runs kBloomSplitPattern with
// Oniguruma, where '[' inside a class opens a nested class: a word is an
// optional U+0020 and a run of code points that are neither \s (Unicode
// White_Space) nor one of ( ) | . , ! ? … 。 ， 、 । ۔ ،. "Isolated" keeps
// both the words and the runs between them as pieces. The spans cover the
// text without gaps.
std::vector<TextSpan> bloom_pretokenize(std::u32string_view text);

}  // namespace gradaccum::data
