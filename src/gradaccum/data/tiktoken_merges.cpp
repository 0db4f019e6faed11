#include "gradaccum/data/tiktoken_merges.h"

#include <array>
#include <cstdint>
#include <unordered_map>

#include "gradaccum/base/check.h"

namespace gradaccum::data {
namespace {

constexpr TokenId kNone = -1;

std::uint64_t pair_key(TokenId left, TokenId right) {
  return (static_cast<std::uint64_t>(left) << 32) | static_cast<std::uint64_t>(right);
}

}  // namespace

std::vector<ByteLevelBpe::IdMerge> tiktoken_merges(const std::vector<TiktokenToken>& tokens,
                                                   const std::string& source) {
  std::array<TokenId, 256> byte_token;
  byte_token.fill(kNone);
  for (const TiktokenToken& t : tokens) {
    if (t.bytes.size() == 1) byte_token[static_cast<unsigned char>(t.bytes[0])] = t.rank;
  }
  // The merges found so far: (left, right) -> merged.
  std::unordered_map<std::uint64_t, TokenId> merged_of;
  merged_of.reserve(tokens.size());
  const auto merged = [&](TokenId left, TokenId right) {
    const auto it = merged_of.find(pair_key(left, right));
    return it == merged_of.end() ? kNone : it->second;
  };

  std::vector<ByteLevelBpe::IdMerge> merges;
  merges.reserve(tokens.size());
  // One token's parts while BPE merges them, and what each part and the next
  // one merge into (kNone if nothing).
  std::vector<TokenId> parts, next_merged;
  for (const TiktokenToken& t : tokens) {
    if (t.bytes.size() < 2) continue;
    parts.clear();
    for (unsigned char b : t.bytes) {
      GA_CHECK(byte_token[b] != kNone,
               "tokenizer file {} line {}: the token of rank {} has byte 0x{:02X}, which has no "
               "token of its own",
               source, t.line, t.rank, static_cast<unsigned>(b));
      parts.push_back(byte_token[b]);
    }
    next_merged.assign(parts.size(), kNone);
    for (std::size_t k = 0; k + 1 < parts.size(); ++k) next_merged[k] = merged(parts[k], parts[k + 1]);
    // Merge the leftmost pair of lowest rank (the merged token's id) until two
    // parts are left, or no pair merges.
    while (parts.size() > 2) {
      std::size_t best = parts.size();
      for (std::size_t k = 0; k + 1 < parts.size(); ++k) {
        if (next_merged[k] != kNone && (best == parts.size() || next_merged[k] < next_merged[best])) {
          best = k;
        }
      }
      if (best == parts.size()) break;
      parts[best] = next_merged[best];
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      next_merged.erase(next_merged.begin() + static_cast<std::ptrdiff_t>(best) + 1);
      next_merged[best] = best + 1 < parts.size() ? merged(parts[best], parts[best + 1]) : kNone;
      if (best > 0) next_merged[best - 1] = merged(parts[best - 1], parts[best]);
    }
    GA_CHECK(parts.size() == 2,
             "tokenizer file {} line {}: the token of rank {} ({} bytes) is not two tokens of lower "
             "rank merged: BPE by the lower ranks leaves {} parts of it (the ranks are not BPE "
             "merge priorities)",
             source, t.line, t.rank, t.bytes.size(), parts.size());
    merged_of.emplace(pair_key(parts[0], parts[1]), t.rank);
    merges.push_back({parts[0], parts[1], t.rank});
  }
  return merges;
}

}  // namespace gradaccum::data
