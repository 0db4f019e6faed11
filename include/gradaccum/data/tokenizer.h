// A byte-level BPE tokenizer loaded from GPT-2's BPE in tiktoken's format
// (gpt2.tiktoken), from GPT-2's original files (encoder.json + vocab.bpe),
// from a Hugging Face tokenizer.json with a BPE model (GPT-2, BLOOM, Llama 3,
// Qwen2, SmolLM2 and their kind), or from the metadata of a GGUF file.
//
// Text handling, the same for all formats:
//  - The input is UTF-8. Invalid bytes are not an error: each maximal
//    ill-formed subsequence is replaced by one U+FFFD before anything else
//    (see decode_utf8), as Python's bytes.decode("utf-8", errors="replace")
//    does, so ids match tiktoken's and Hugging Face's on the text such a decode gives.
//  - A tokenizer.json's added tokens are cut out first (added_token_split.h),
//    then its pre-tokenizer (pre_tokenizer.h) cuts the rest into pieces, with
//    its regular expressions run by PCRE2 as Hugging Face's Oniguruma runs them
//    (pcre2_regex.h); GPT-2's files get GPT-2's ByteLevel pre-tokenizer.
//    docs/tokenizer.md lists these decisions and what the tests compare.
//  - decode() returns the bytes the ids stand for; a cut through a multi-byte
//    character leaves invalid UTF-8, which is returned as is.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradaccum/data/byte_level_bpe.h"

namespace gradaccum::data {

class PreTokenizer;
class AddedTokenSplitter;
class Normalizer;

// Where scripts/setup.sh puts GPT-2's gpt2.tiktoken (from PyPI's openai-whisper).
// The CLI lets GRADACCUM_TOKENIZER_DIR override it.
inline constexpr const char* kDefaultTokenizerDir = "/var/lib/gradaccum/gpt2";

// A token outside the BPE merges: tokenizer.json's added_tokens, or GPT-2's
// <|endoftext|> (50256). The flags are tokenizer.json's (added_token_split.h
// says how each changes where the token is found).
struct AddedToken {
  TokenId id;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

class Tokenizer {
 public:
  // path: a directory holding tokenizer.json, gpt2.tiktoken, or encoder.json
  // and vocab.bpe (looked for in that order); a file whose name ends in
  // ".tiktoken" or ".gguf"; or a tokenizer.json file (any other name). Throws
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
  // Supports model.type "BPE" (merges as "a b" strings or ["a", "b"] pairs;
  // ignore_merges), no normalizer, a pre-tokenizer of ByteLevel, Split and
  // Digits steps ending in ByteLevel (pre_tokenizer.h), added tokens with their
  // flags, and a ByteLevel decoder (or none). Anything else is rejected with
  // an error naming the file and the part; so are two tokens on one id and ids
  // far beyond the number of tokens the file holds (checked before the id
  // tables are allocated).
  static Tokenizer from_hf_json(const std::string& tokenizer_json_path);
  // A GGUF file's tokenizer (tokenizer.ggml.*): the tokenizer.json that
  // gguf_tokenizer_json (gguf_tokenizer.h) makes of it, read as from_hf_json
  // reads a file. source() is the GGUF file.
  static Tokenizer from_gguf(const std::string& gguf_path);

  // Token ids of the text. With a tokenizer.json, added tokens found in the
  // text become their own ids, as Hugging Face does (added_token_split.h).
  // With GPT-2's
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
  static Tokenizer from_hf_json_checked(const nlohmann::json& root, const std::string& path);
  Tokenizer(std::string source, ByteLevelBpe bpe, std::shared_ptr<const PreTokenizer> pre_tokenizer);
  void encode_plain(std::string_view text, std::vector<TokenId>& ids) const;

  std::string source_;
  ByteLevelBpe bpe_;
  std::shared_ptr<const PreTokenizer> pre_tokenizer_;
  std::vector<AddedToken> added_;
  // Finds added_ in the text (tokenizer.json only; null: added tokens are plain text).
  std::shared_ptr<const AddedTokenSplitter> added_splitter_;
  // tokenizer.json's normalizer (data/normalizer.h; null: none).
  std::shared_ptr<const Normalizer> normalizer_;
};

}  // namespace gradaccum::data
