// The merge list that a tiktoken rank table implies (what GPT-2's vocab.bpe
// holds), so that ByteLevelBpe can encode with a .tiktoken file.
//
// tiktoken's BPE merges, among adjacent parts, the pair whose concatenation has
// the lowest rank. So every token of two or more bytes was made by merging two
// tokens of lower rank, and which two is what BPE itself does with the token's
// bytes: going through the tokens in rank order, a token's merge is the two
// parts that BPE with the merges found so far (all of lower rank) leaves of its
// bytes. For GPT-2's file this gives back vocab.bpe's 50,000 merges, and BPE
// by these merges gives tiktoken's ids (docs/tokenizer.md says how that was
// checked).
#pragma once

#include <string>
#include <vector>

#include "gradaccum/data/byte_level_bpe.h"
#include "gradaccum/data/tiktoken_ranks.h"

namespace gradaccum::data {

// The merge of each token of two or more bytes, by ids (the ranks), in rank
// order of the merged token; tokens must be sorted by rank (as
// parse_tiktoken_ranks returns them). Throws gradaccum::Error naming source and
// the token's line when a byte of a token has no single-byte token, or when
// BPE leaves more than two parts of a token (then the ranks are not BPE merge
// priorities).
std::vector<ByteLevelBpe::IdMerge> tiktoken_merges(const std::vector<TiktokenToken>& tokens, const std::string& source);

}  // namespace gradaccum::data
