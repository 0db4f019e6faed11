// A byte-level BPE tokenizer loaded from GPT-2's BPE in tiktoken's format
// (gpt2.tiktoken), from GPT-2's original files (encoder.json + vocab.bpe), or
// from a Hugging Face tokenizer.json with a BPE model.
//
// Text handling, the same for all formats:
//  - The input is UTF-8. Invalid bytes are not an error: each maximal
//    ill-formed subsequence is replaced by one U+FFFD before pre-tokenization
//    (see decode_utf8), as Python's bytes.decode("utf-8", errors="replace")
//    does, so ids match tiktoken's on the text such a decode gives.
//  - Pre-tokenization is GPT-2's regex (gpt2_pretokenizer.h) with \s meaning
//    Unicode's White_Space (as in tiktoken and Hugging Face tokenizers) or, for
//    BLOOM's tokenizer.json, BLOOM's (bloom_pretokenizer.h); Unicode classes
//    come from generated tables (Unicode 14.0; see scripts/gen_unicode_tables.py).
//    docs/tokenizer.md lists these decisions and what the tests compare.
//  - decode() returns the bytes the ids stand for; a cut through a multi-byte
//    character leaves invalid UTF-8, which is returned as is.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradaccum/data/byte_level_bpe.h"
#include "gradaccum/data/unicode_tables.h"

namespace gradaccum::data {

// Where scripts/setup.sh puts GPT-2's gpt2.tiktoken (from PyPI's openai-whisper).
// The CLI lets GRADACCUM_TOKENIZER_DIR override it.
inline constexpr const char* kDefaultTokenizerDir = "/var/lib/gradaccum/gpt2";

// A token outside the BPE merges: tokenizer.json's added_tokens, or GPT-2's
// <|endoftext|> (50256).
struct AddedToken {
  TokenId id;
  std::string content;
  bool special;
};

// How plain text is cut into pieces before BPE.
enum class TextSplit {
  kGpt2Regex,   // gpt2_pretokenize
  kBloomRegex,  // bloom_pretokenize
  kNone,        // the whole text is one piece (ByteLevel with use_regex false)
};

class Tokenizer {
 public:
  // path: a directory holding tokenizer.json, gpt2.tiktoken, or encoder.json
  // and vocab.bpe (looked for in that order); a file whose name ends in
  // ".tiktoken"; or a tokenizer.json file (any other name). Throws
  // gradaccum::Error naming the file when a file is missing or malformed.
  static Tokenizer load(const std::string& path);
  // GPT-2's BPE ranks in tiktoken's format (tiktoken_ranks.h); the merges are
  // derived from the ranks (tiktoken_merges.h), and <|endoftext|> is added with
  // id 50256. Gives the same ids as from_gpt2_files with GPT-2's files, and as
  // tiktoken's "gpt2" encoding (encode_ordinary). A malformed line is an error
  // naming the file, the line and what is wrong.
  static Tokenizer from_tiktoken(const std::string& tiktoken_path);
  // GPT-2's original files: encoder.json (token -> id) and vocab.bpe (merges).
  static Tokenizer from_gpt2_files(const std::string& encoder_json_path, const std::string& vocab_bpe_path);
  // Supports model.type "BPE" (merges as "a b" strings or ["a", "b"] pairs), no
  // normalizer, and as pre-tokenizer either ByteLevel (alone or as the only
  // step of a Sequence: GPT-2's kind) or BLOOM's Sequence of its Split regex
  // and a ByteLevel without regex. Anything else is rejected with an error
  // naming it. The text is split as Hugging Face tokenizers does, whose regex
  // engine (Oniguruma) counts U+0085 as whitespace and U+FEFF not.
  static Tokenizer from_hf_json(const std::string& tokenizer_json_path);

  // Token ids of the text. With a tokenizer.json, added tokens found verbatim in
  // the text become their own ids, leftmost then longest first, as Hugging Face
  // does (their lstrip/rstrip/single_word options are ignored). With GPT-2's
  // files (.tiktoken or encoder.json), "<|endoftext|>" in the text is encoded
  // as plain text, as tiktoken's encode_ordinary does; token_id("<|endoftext|>")
  // gives its id to append.
  // No special tokens are added around the text (no post-processor).
  std::vector<TokenId> encode(std::string_view text) const;
  std::string decode(const std::vector<TokenId>& ids) const;

  std::optional<TokenId> token_id(std::string_view token) const { return bpe_.token_id(token); }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  // One more than the largest id (the embedding table's size).
  std::size_t id_count() const { return bpe_.id_count(); }
  // The file(s) it was loaded from.
  const std::string& source() const { return source_; }

 private:
  static Tokenizer from_hf_json_checked(const std::string& tokenizer_json_path);
  Tokenizer(std::string source, ByteLevelBpe bpe);
  void encode_plain(std::string_view text, std::vector<TokenId>& ids) const;

  std::string source_;
  ByteLevelBpe bpe_;
  TextSplit split_ = TextSplit::kGpt2Regex;
  SpaceDefinition spaces_ = SpaceDefinition::kUnicodeWhiteSpace;  // for kGpt2Regex
  bool add_prefix_space_ = false;
  std::vector<AddedToken> added_;
  // Indices into added_, longest content first, when they are matched in the text.
  std::vector<std::size_t> matched_added_;
};

}  // namespace gradaccum::data
