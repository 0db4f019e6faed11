// Reads GPT-2's BPE in tiktoken's format (a .tiktoken file, e.g. the
// gpt2.tiktoken that scripts/setup.sh installs): one line per token,
//   <base64 of the token's bytes> SPACE <rank>
// where the rank is both the token's id and its merge priority (the lower, the
// earlier BPE merges it). GPT-2's file has ranks 0..50255; <|endoftext|> is
// 50256 and not in the file. tiktoken_merges.h turns the ranks into the merge
// list that ByteLevelBpe takes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gradaccum/data/byte_level_bpe.h"

namespace gradaccum::data {

// GPT-2's special token and its id, which comes after the file's ranks.
inline constexpr const char* kGpt2EndOfText = "<|endoftext|>";
inline constexpr TokenId kGpt2EndOfTextId = 50256;

struct TiktokenToken {
  std::string bytes;  // the token's bytes (any bytes, not necessarily UTF-8)
  TokenId rank;
  std::size_t line;  // 1-based line of the file, for error messages
};

// The tokens of a .tiktoken file's text, sorted by rank. source names the file
// in error messages. Lines are separated by '\n'; a '\r' ending a line is
// dropped and empty lines are skipped (as tiktoken's own loader does). Anything
// else that is not `<base64> <rank>` throws gradaccum::Error, one line naming
// the file, the line number and what is wrong:
//  - a line with no space, or nothing after it ("no rank");
//  - a token that is empty or not canonical base64 (RFC 4648 alphabet, padded
//    to a multiple of 4 characters, unused bits zero);
//  - a rank that is not a decimal integer (digits only), or above 2^31 - 2;
//  - rank 50256, which is <|endoftext|>'s (a file that uses it, such as
//    cl100k_base.tiktoken, is not GPT-2's vocabulary);
//  - a rank or a token that an earlier line already has.
// A text without any token is an error too. Errors read
// "tokenizer file <source> line <n>: <what>".
std::vector<TiktokenToken> parse_tiktoken_ranks(std::string_view text, const std::string& source);

}  // namespace gradaccum::data
