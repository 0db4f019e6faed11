#include "gradaccum/data/tiktoken_ranks.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <unordered_map>

#include "gradaccum/base/check.h"
#include "gradaccum/data/text_lines.h"

namespace gradaccum::data {
namespace {

// The largest rank: ByteLevelBpe keeps ids below INT32_MAX.
constexpr TokenId kMaxRank = std::numeric_limits<std::int32_t>::max() - 1;

// The first 40 characters of a line for an error message, quoted, with
// anything outside printable ASCII written as \xNN so the message stays one
// readable line.
std::string quoted(std::string_view text) {
  constexpr std::size_t kMaxShown = 40;
  std::string out = "\"";
  for (std::size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02X}", static_cast<unsigned>(c));
    }
  }
  out += text.size() > kMaxShown ? "\"..." : "\"";
  return out;
}

// RFC 4648's alphabet: the value of each character, or -1.
const std::array<int, 256>& base64_values() {
  static const std::array<int, 256> values = [] {
    std::array<int, 256> v{};
    v.fill(-1);
    const std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (std::size_t i = 0; i < alphabet.size(); ++i) v[static_cast<unsigned char>(alphabet[i])] = static_cast<int>(i);
    return v;
  }();
  return values;
}

// Decodes canonical padded base64 into out; false when text is not that.
bool decode_base64(std::string_view text, std::string& out) {
  out.clear();
  if (text.empty() || text.size() % 4 != 0) return false;
  std::size_t padding = 0;
  if (text.back() == '=') padding = text[text.size() - 2] == '=' ? 2 : 1;
  const auto& values = base64_values();
  std::uint32_t bits = 0;
  for (std::size_t i = 0; i < text.size() - padding; ++i) {
    const int v = values[static_cast<unsigned char>(text[i])];
    if (v < 0) return false;  // also an '=' before the padding
    bits = (bits << 6) | static_cast<std::uint32_t>(v);
    if (i % 4 == 3) {
      out.push_back(static_cast<char>(bits >> 16));
      out.push_back(static_cast<char>(bits >> 8));
      out.push_back(static_cast<char>(bits));
      bits = 0;
    }
  }
  if (padding == 2) {  // 2 characters: 12 bits, 1 byte, 4 unused bits
    if ((bits & 0xF) != 0) return false;
    out.push_back(static_cast<char>(bits >> 4));
  } else if (padding == 1) {  // 3 characters: 18 bits, 2 bytes, 2 unused bits
    if ((bits & 0x3) != 0) return false;
    out.push_back(static_cast<char>(bits >> 10));
    out.push_back(static_cast<char>(bits >> 2));
  }
  return true;
}

}  // namespace

std::vector<TiktokenToken> parse_tiktoken_ranks(std::string_view text, const std::string& source) {
  std::vector<TiktokenToken> tokens;
  std::vector<std::string_view> base64_of;  // each token's text on its line
  tokens.reserve(text.size() / 16 + 1);
  base64_of.reserve(tokens.capacity());
  std::string bytes;
  for_each_line(text, [&](int64_t number, std::string_view line) {
    const auto line_no = static_cast<std::size_t>(number);
    if (line.empty()) return;
    const std::size_t space = line.find(' ');
    GA_CHECK(space != std::string_view::npos && space + 1 < line.size(),
             "tokenizer file {} line {}: no rank: expected \"<base64 token> <rank>\", got {}", source, line_no,
             quoted(line));
    const std::string_view token = line.substr(0, space), rank_text = line.substr(space + 1);
    GA_CHECK(!token.empty(), "tokenizer file {} line {}: the token before the rank is empty", source, line_no);
    GA_CHECK(decode_base64(token, bytes), "tokenizer file {} line {}: token {} is not valid base64", source, line_no,
             quoted(token));
    const bool digits = std::all_of(rank_text.begin(), rank_text.end(), [](char c) { return c >= '0' && c <= '9'; });
    GA_CHECK(digits, "tokenizer file {} line {}: rank {} is not a non-negative integer", source, line_no,
             quoted(rank_text));
    TokenId rank = 0;
    for (char c : rank_text) {
      rank = rank * 10 + (c - '0');
      GA_CHECK(rank <= kMaxRank, "tokenizer file {} line {}: rank {} is too large (above {})", source, line_no,
               quoted(rank_text), kMaxRank);
    }
    GA_CHECK(rank != kGpt2EndOfTextId,
             "tokenizer file {} line {}: rank {} is GPT-2's {} id, which a .tiktoken file must leave "
             "free (only GPT-2's vocabulary is supported)",
             source, line_no, rank, kGpt2EndOfText);
    tokens.push_back({bytes, rank, line_no});
    base64_of.push_back(token);
  });
  GA_CHECK(!tokens.empty(), "tokenizer file {} has no tokens", source);

  // Repeats: report the earliest line that repeats a token or a rank.
  std::size_t first_repeat = 0;  // 0: none
  std::string repeat_message;
  {
    std::unordered_map<std::string_view, std::size_t> index_of_token;
    index_of_token.reserve(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto [it, inserted] = index_of_token.emplace(tokens[i].bytes, i);
      if (!inserted) {
        first_repeat = tokens[i].line;
        repeat_message = fmt::format("token {} is already on line {}", quoted(base64_of[i]), tokens[it->second].line);
        break;
      }
    }
  }
  std::sort(tokens.begin(), tokens.end(), [](const TiktokenToken& a, const TiktokenToken& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.line < b.line;
  });
  for (std::size_t i = 1; i < tokens.size(); ++i) {
    if (tokens[i].rank == tokens[i - 1].rank && (first_repeat == 0 || tokens[i].line < first_repeat)) {
      // Sorted by (rank, line): tokens[i - 1] is the earlier line with this rank.
      first_repeat = tokens[i].line;
      repeat_message = fmt::format("rank {} is already the rank of line {}", tokens[i].rank, tokens[i - 1].line);
    }
  }
  GA_CHECK(first_repeat == 0, "tokenizer file {} line {}: {}", source, first_repeat, repeat_message);
  return tokens;
}

}  // namespace gradaccum::data
