#include "gradaccum/data/byte_level_bpe.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>

#include "gradaccum/base/check.h"
#include "gradaccum/data/utf8.h"

namespace gradaccum::data {
namespace {

// The largest id of (token, id) pairs, each checked to fit the merge table's int32 ids.
template <typename Pairs>
TokenId largest_id(const Pairs& pairs, const std::string& source) {
  TokenId max_id = -1;
  for (const auto& [token, id] : pairs) {
    GA_CHECK(id >= 0 && id < std::numeric_limits<std::int32_t>::max(), "{}: token id {} out of range", source, id);
    max_id = std::max(max_id, id);
  }
  return max_id;
}

// The bytes a token's byte characters stand for, when every character is one;
// else the token's own UTF-8 (Hugging Face's ByteLevel decoder, per token).
std::string token_bytes(const std::string& token) {
  static const std::unordered_map<char32_t, int> unicode_to_byte = [] {
    std::unordered_map<char32_t, int> map;
    for (int b = 0; b < 256; ++b) map[byte_to_unicode()[b]] = b;
    return map;
  }();
  std::string bytes;
  for (char32_t c : decode_utf8(token)) {
    const auto it = unicode_to_byte.find(c);
    if (it == unicode_to_byte.end()) return token;
    bytes.push_back(static_cast<char>(it->second));
  }
  return bytes;
}

// Whether every character of token is a byte character.
bool is_byte_level(const std::string& token, const std::string& bytes) {
  std::string characters;
  for (unsigned char b : bytes) append_utf8(characters, byte_to_unicode()[b]);
  return characters == token;
}

}  // namespace

const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

ByteLevelBpe::ByteLevelBpe(const std::unordered_map<std::string, TokenId>& vocab, const std::vector<Merge>& merges,
                           std::string source)
    : source_(std::move(source)), ids_(vocab) {
  size_id_tables(largest_id(vocab, source_));
  for (const auto& [token, id] : vocab) {
    id_bytes_[id] = token_bytes(token);
    id_known_[id] = true;
  }

  byte_token_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, byte_to_unicode()[b]);
    if (auto id = token_id(ch)) byte_token_[b] = *id;
  }

  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto ia = token_id(a), ib = token_id(b), im = token_id(a + b);
    GA_CHECK(ia && ib && im, "{}: merge {} ('{} {}') uses a token missing from the vocabulary ('{}')", source_, rank, a,
             b,
             !ia   ? a
             : !ib ? b
                   : a + b);
    // A repeated merge keeps its last rank, as GPT-2's dict(zip(merges, ranks))
    // and gpt-3-encoder do.
    merges_.insert_or_assign(pair_key(*ia, *ib), MergeResult{static_cast<std::int32_t>(rank), *im});
  }
}

ByteLevelBpe::ByteLevelBpe(const std::vector<std::pair<std::string_view, TokenId>>& tokens,
                           const std::vector<IdMerge>& merges, std::string source)
    : source_(std::move(source)) {
  size_id_tables(largest_id(tokens, source_));
  byte_token_.fill(-1);
  ids_.reserve(tokens.size());
  for (const auto& [bytes, id] : tokens) {
    std::string characters;
    for (unsigned char b : bytes) append_utf8(characters, byte_to_unicode()[b]);
    ids_.insert_or_assign(std::move(characters), id);
    id_bytes_[id] = std::string(bytes);
    id_known_[id] = true;
    if (bytes.size() == 1) byte_token_[static_cast<unsigned char>(bytes[0])] = id;
  }
  const auto known = [&](TokenId id) {
    return id >= 0 && static_cast<std::size_t>(id) < id_known_.size() && id_known_[id];
  };
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const IdMerge& m = merges[rank];
    GA_CHECK(known(m.left) && known(m.right) && known(m.merged),
             "{}: merge {} ({} + {} = {}) names an id without a token", source_, rank, m.left, m.right, m.merged);
    merges_.insert_or_assign(pair_key(m.left, m.right), MergeResult{static_cast<std::int32_t>(rank), m.merged});
  }
}

void ByteLevelBpe::size_id_tables(TokenId max_id) {
  id_bytes_.resize(static_cast<std::size_t>(max_id + 1));
  id_known_.assign(id_bytes_.size(), false);
}

ByteLevelBpe::ByteLevelBpe(const ByteLevelBpe& other)
    : source_(other.source_),
      ids_(other.ids_),
      id_bytes_(other.id_bytes_),
      id_known_(other.id_known_),
      byte_token_(other.byte_token_),
      merges_(other.merges_),
      whole_tokens_(other.whole_tokens_),
      drop_unknown_bytes_(other.drop_unknown_bytes_) {}

ByteLevelBpe::ByteLevelBpe(ByteLevelBpe&& other)
    : source_(std::move(other.source_)),
      ids_(std::move(other.ids_)),
      id_bytes_(std::move(other.id_bytes_)),
      id_known_(std::move(other.id_known_)),
      byte_token_(other.byte_token_),
      merges_(std::move(other.merges_)),
      whole_tokens_(std::move(other.whole_tokens_)),
      drop_unknown_bytes_(other.drop_unknown_bytes_) {}

std::optional<TokenId> ByteLevelBpe::token_id(std::string_view token) const {
  const auto it = ids_.find(std::string(token));
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

void ByteLevelBpe::add_literal_token(TokenId id, const std::string& content) {
  GA_CHECK(id >= 0 && id < std::numeric_limits<std::int32_t>::max(), "{}: token id {} out of range", source_, id);
  if (static_cast<std::size_t>(id) >= id_bytes_.size()) {
    id_bytes_.resize(static_cast<std::size_t>(id) + 1);
    id_known_.resize(id_bytes_.size(), false);
  }
  if (!id_known_[id]) {
    id_bytes_[id] = token_bytes(content);
    id_known_[id] = true;
    ids_.emplace(content, id);
  }
}

void ByteLevelBpe::ignore_merges() {
  whole_tokens_.reserve(ids_.size());
  for (const auto& [token, id] : ids_) {
    if (is_byte_level(token, id_bytes_[id])) whole_tokens_.emplace(id_bytes_[id], id);
  }
}

// Repeatedly merges every occurrence (left to right) of the adjacent pair with
// the lowest merge rank, until no adjacent pair has a rank: GPT-2's bpe().
// O(n) per merge, so quadratic: long pieces go to merge_symbols_heap.
void ByteLevelBpe::merge_symbols(std::vector<TokenId>& symbols) const {
  if (symbols.size() > kLongPiece) {
    merge_symbols_heap(symbols);
    return;
  }
  std::vector<TokenId> next;
  while (symbols.size() > 1) {
    const MergeResult* best = nullptr;
    TokenId first = 0, second = 0;
    for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = merges_.find(pair_key(symbols[i], symbols[i + 1]));
      if (it != merges_.end() && (best == nullptr || it->second.rank < best->rank)) {
        best = &it->second;
        first = symbols[i];
        second = symbols[i + 1];
      }
    }
    if (best == nullptr) break;
    next.clear();
    for (std::size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == first && symbols[i + 1] == second) {
        next.push_back(best->merged);
        i += 2;
      } else {
        next.push_back(symbols[i]);
        i += 1;
      }
    }
    symbols.swap(next);
  }
}

// The same merges in O(n log n), as Hugging Face tokenizers does it: a heap of
// candidate pairs ordered by (rank, position), symbols in a linked list.
// Merging the leftmost lowest-rank pair first equals merging all of its
// occurrences left to right in one pass, since a pair formed by a merge has a
// later rank than that merge in a trained merge list.
void ByteLevelBpe::merge_symbols_heap(std::vector<TokenId>& symbols) const {
  struct Candidate {
    std::int32_t rank;
    std::size_t left;  // position of the pair's left symbol
    TokenId merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  const std::size_t n = symbols.size();
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = i == 0 ? kNone : i - 1;
    next[i] = i + 1 == n ? kNone : i + 1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto push = [&](std::size_t left) {
    if (left == kNone || next[left] == kNone) return;
    const auto it = merges_.find(pair_key(symbols[left], symbols[next[left]]));
    if (it != merges_.end()) heap.push({it->second.rank, left, it->second.merged});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    const std::size_t right = next[top.left];
    if (!alive[top.left] || right == kNone) continue;
    // Stale when either symbol changed since the candidate was pushed.
    const auto it = merges_.find(pair_key(symbols[top.left], symbols[right]));
    if (it == merges_.end() || it->second.merged != top.merged) continue;
    symbols[top.left] = top.merged;
    alive[right] = false;
    next[top.left] = next[right];
    if (next[right] != kNone) prev[next[right]] = top.left;
    push(prev[top.left]);
    push(top.left);
  }
  std::size_t out = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (alive[i]) symbols[out++] = symbols[i];
  }
  symbols.resize(out);
}

void ByteLevelBpe::encode_piece(std::string_view bytes, std::vector<TokenId>& out) const {
  if (bytes.empty()) return;
  std::string key(bytes);
  if (!whole_tokens_.empty()) {
    const auto whole = whole_tokens_.find(key);
    if (whole != whole_tokens_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<TokenId> symbols;
  symbols.reserve(bytes.size());
  for (unsigned char b : bytes) {
    if (byte_token_[b] < 0) {
      GA_CHECK(drop_unknown_bytes_, "{}: the vocabulary has no token for byte 0x{:02X}", source_, b);
      continue;
    }
    symbols.push_back(byte_token_[b]);
  }
  merge_symbols(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kMaxCacheEntries) cache_.clear();
  cache_.emplace(std::move(key), std::move(symbols));
}

std::string ByteLevelBpe::decode(const std::vector<TokenId>& ids) const {
  std::string out;
  for (TokenId id : ids) {
    GA_CHECK(id >= 0 && static_cast<std::size_t>(id) < id_known_.size() && id_known_[id],
             "token id {} is not in the vocabulary of {}", id, source_);
    out += id_bytes_[id];
  }
  return out;
}

}  // namespace gradaccum::data
