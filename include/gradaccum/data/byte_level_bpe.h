// Byte-level BPE (GPT-2's): a piece of text is mapped byte by byte onto 256
// printable "byte characters", then adjacent symbols are merged by rank.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gradaccum::data {

using TokenId = std::int64_t;

// GPT-2's bytes_to_unicode: byte b is shown as code point byte_to_unicode()[b].
// Printable Latin-1 bytes map to themselves, the other 68 to U+0100 onwards.
const std::array<char32_t, 256>& byte_to_unicode();

class ByteLevelBpe {
 public:
  using Merge = std::pair<std::string, std::string>;

  // vocab maps a token (UTF-8 of byte characters) to its id; merges are in rank
  // order (rank 0 first). source names the file(s) in error messages. Throws
  // gradaccum::Error when a merge names a token missing from the vocabulary.
  ByteLevelBpe(const std::unordered_map<std::string, TokenId>& vocab, const std::vector<Merge>& merges,
               std::string source);

  // The same from raw token bytes and merges by id, as a .tiktoken file gives
  // them (tokenizer.cpp, from_tiktoken): tokens are (bytes, id); merges[r] is
  // the merge of rank r. Throws gradaccum::Error when a merge names an unknown id.
  struct IdMerge {
    TokenId left, right, merged;
  };
  ByteLevelBpe(const std::vector<std::pair<std::string_view, TokenId>>& tokens, const std::vector<IdMerge>& merges,
               std::string source);

  ByteLevelBpe(const ByteLevelBpe& other);
  // Moves the tables (a copy of GPT-2's costs ~10 ms); the cache starts empty.
  ByteLevelBpe(ByteLevelBpe&& other);
  ByteLevelBpe& operator=(const ByteLevelBpe&) = delete;

  // Appends the ids of one pre-tokenized piece (raw bytes) to out. Results are
  // cached; safe to call from several threads.
  void encode_piece(std::string_view bytes, std::vector<TokenId>& out) const;

  // Registers a token outside the merges (an added token absent from the
  // vocabulary, such as a special token), decoded as a vocabulary token is;
  // token_id finds it too.
  void add_literal_token(TokenId id, const std::string& content);

  // Bytes without a token of their own are left out of the ids, as Hugging Face's BPE leaves out
  // characters without an id when it has no unk_token (SmolLM2's vocabulary lacks 21 of the 256
  // bytes); without this call such a byte is an error.
  void drop_unknown_bytes() { drop_unknown_bytes_ = true; }

  // Hugging Face's BPE option ignore_merges (Llama 3 sets it): a piece that is a
  // vocabulary token as a whole is that token, whatever the merges would make
  // of it. Call before add_literal_token.
  void ignore_merges();

  // The bytes the ids stand for. A token made of byte characters only becomes
  // their bytes; any other is kept as its UTF-8 (as Hugging Face's ByteLevel
  // decoder does, token by token). Throws gradaccum::Error on an unknown id.
  std::string decode(const std::vector<TokenId>& ids) const;

  std::optional<TokenId> token_id(std::string_view token) const;
  // One more than the largest id.
  std::size_t id_count() const { return id_bytes_.size(); }

 private:
  // Sizes id_bytes_ and id_known_ for ids 0..max_id, none known yet.
  void size_id_tables(TokenId max_id);
  struct MergeResult {
    std::int32_t rank;
    TokenId merged;
  };
  static std::uint64_t pair_key(TokenId a, TokenId b) {
    return (static_cast<std::uint64_t>(a) << 32) | static_cast<std::uint64_t>(b);
  }
  void merge_symbols(std::vector<TokenId>& symbols) const;
  void merge_symbols_heap(std::vector<TokenId>& symbols) const;

  // Pieces longer than this (in bytes) are merged with the heap.
  static constexpr std::size_t kLongPiece = 64;

  std::string source_;
  std::unordered_map<std::string, TokenId> ids_;
  std::vector<std::string> id_bytes_;      // id -> decoded bytes
  std::vector<bool> id_known_;             // id -> present in vocab or added
  std::array<TokenId, 256> byte_token_{};  // byte -> id of its one-character token, or -1
  std::unordered_map<std::uint64_t, MergeResult> merges_;
  // With ignore_merges: the bytes of each byte-level vocabulary token -> its id.
  std::unordered_map<std::string, TokenId> whole_tokens_;
  bool drop_unknown_bytes_ = false;

  static constexpr std::size_t kMaxCacheEntries = 1 << 18;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache_;
};

}  // namespace gradaccum::data
