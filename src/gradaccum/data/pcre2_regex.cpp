#include "gradaccum/data/pcre2_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "gradaccum/base/check.h"

namespace gradaccum::data {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int length = pcre2_get_error_message(code, buffer, sizeof buffer);
  return length < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buffer));
}

// One match-data block per thread, shared by every expression: only the whole
// match's offsets are read (a block of one pair holds them; PCRE2 then returns 0).
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(data); }
  };
  thread_local Holder holder;
  GA_CHECK(holder.data != nullptr, "out of memory for a regular expression's match data");
  return holder.data;
}

// Unicode's White_Space, Oniguruma's \s (PCRE2's \s also has U+180E).
constexpr const char* kWhiteSpace =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
// Oniguruma's \w with Unicode: Letter, Mark, Number, Connector_Punctuation.
constexpr const char* kWord = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr const char* kHexDigit = "0-9a-fA-F";

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Bytes of the UTF-8 character starting with byte c (1 for a stray byte).
std::size_t utf8_length(char c) {
  const auto b = static_cast<unsigned char>(c);
  return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

class OnigurumaTranslator {
 public:
  OnigurumaTranslator(std::string_view pattern, const std::string& what) : p_(pattern), what_(what) {}

  std::string translate() {
    std::string out;
    while (i_ < p_.size()) {
      const char c = p_[i_];
      if (c == '\\') {
        escape_outside_class(out);
      } else if (c == '[') {
        ++i_;
        out += translate_class();
      } else if (c == '(' && p_.substr(i_, 2) == "(?") {
        out += "(?";
        i_ += 2;
        translate_options(out);
      } else if (c == '{' && p_.substr(i_, 2) == "{,") {
        out += "{0,";
        i_ += 2;
      } else {
        copy_character(out);
      }
    }
    return out;
  }

 private:
  [[noreturn]] void unsupported(const std::string& construct) const {
    throw Error(fmt::format("{} {}: {} is not supported", what_, quote_pattern_start(p_), construct));
  }

  void copy_character(std::string& out) {
    const std::size_t n = std::min(utf8_length(p_[i_]), p_.size() - i_);
    out.append(p_.substr(i_, n));
    i_ += n;
  }

  // \uHHHH as \x{HHHH}; returns false when the escape at i_ is not one.
  bool unicode_escape(std::string& out) {
    if (p_.substr(i_, 2) != "\\u" || i_ + 6 > p_.size()) return false;
    for (std::size_t k = i_ + 2; k < i_ + 6; ++k) {
      if (!is_hex(p_[k])) return false;
    }
    out += "\\x{" + std::string(p_.substr(i_ + 2, 4)) + "}";
    i_ += 6;
    return true;
  }

  void escape_outside_class(std::string& out) {
    if (i_ + 1 >= p_.size()) {
      out += '\\';  // PCRE2 reports the trailing backslash
      ++i_;
      return;
    }
    if (unicode_escape(out)) return;
    const char e = p_[i_ + 1];
    switch (e) {
      case 's':
        out += fmt::format("[{}]", kWhiteSpace);
        break;
      case 'S':
        out += fmt::format("[^{}]", kWhiteSpace);
        break;
      case 'w':
        out += fmt::format("[{}]", kWord);
        break;
      case 'W':
        out += fmt::format("[^{}]", kWord);
        break;
      case 'h':
        out += fmt::format("[{}]", kHexDigit);
        break;
      case 'H':
        out += fmt::format("[^{}]", kHexDigit);
        break;
      case 'b':
      case 'B':
        unsupported(std::string("the word boundary \\") + e);
      default:
        out += '\\';
        ++i_;
        copy_character(out);
        return;
    }
    i_ += 2;
  }

  // After "(?": Ruby's option letters i, m, x (m is PCRE2's s), then ':' or ')'.
  void translate_options(std::string& out) {
    std::size_t k = i_;
    while (k < p_.size() && (p_[k] == 'i' || p_[k] == 'm' || p_[k] == 'x' || p_[k] == '-')) ++k;
    if (k == i_ || k >= p_.size() || (p_[k] != ':' && p_[k] != ')')) return;  // another group kind
    for (; i_ < k; ++i_) out += p_[i_] == 'm' ? 's' : p_[i_];
  }

  // The body of a class whose '[' was consumed, up to and including its ']',
  // as one PCRE2 class; nested classes are merged into it.
  std::string translate_class() {
    bool negated = false;
    if (i_ < p_.size() && p_[i_] == '^') {
      negated = true;
      ++i_;
    }
    const std::string items = class_items(true);
    return std::string(negated ? "[^" : "[") + items + "]";
  }

  std::string class_items(bool first) {
    std::string items;
    for (;;) {
      if (i_ >= p_.size()) {
        // Unterminated: hand PCRE2 what there is, and let it say so.
        return items;
      }
      const char c = p_[i_];
      if (c == ']' && !(first && items.empty())) {
        ++i_;
        return items;
      }
      if (c == ']') {  // a ']' first in the class is literal
        items += "\\]";
        ++i_;
        continue;
      }
      if (c == '\\') {
        class_escape(items);
      } else if (c == '[' && p_.substr(i_, 2) == "[:") {
        const std::size_t close = p_.find(":]", i_ + 2);
        if (close == std::string_view::npos) unsupported("an unterminated POSIX bracket [:");
        items.append(p_.substr(i_, close + 2 - i_));
        i_ = close + 2;
      } else if (c == '[') {
        ++i_;
        if (i_ < p_.size() && p_[i_] == '^') unsupported("a negated class inside a class");
        items += class_items(true);
      } else if (c == '&' && p_.substr(i_, 2) == "&&") {
        unsupported("class intersection &&");
      } else {
        copy_character(items);
      }
      first = false;
    }
  }

  void class_escape(std::string& items) {
    if (i_ + 1 >= p_.size()) {
      items += '\\';
      ++i_;
      return;
    }
    if (unicode_escape(items)) return;
    const char e = p_[i_ + 1];
    switch (e) {
      case 's':
        items += kWhiteSpace;
        break;
      case 'w':
        items += kWord;
        break;
      case 'h':
        items += kHexDigit;
        break;
      case 'S':
      case 'W':
      case 'H':
        unsupported(std::string("\\") + e + " inside a class");
      default:
        items += '\\';
        ++i_;
        copy_character(items);
        return;
    }
    i_ += 2;
  }

  std::string_view p_;
  const std::string& what_;
  std::size_t i_ = 0;
};

}  // namespace

std::string quote_pattern_start(std::string_view pattern) {
  constexpr std::size_t kShown = 40;
  std::size_t bytes = 0, characters = 0;
  while (bytes < pattern.size() && characters < kShown) {
    bytes += std::min(utf8_length(pattern[bytes]), pattern.size() - bytes);
    ++characters;
  }
  std::string shown(pattern.substr(0, bytes));
  if (bytes < pattern.size()) shown += "...";
  // dump escapes control characters, so the message stays on one line; an
  // invalid byte (the file was valid JSON, so none should occur) becomes U+FFFD.
  return nlohmann::json(shown).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string pcre2_from_oniguruma(std::string_view pattern, const std::string& what) {
  return OnigurumaTranslator(pattern, what).translate();
}

Pcre2Regex::Pcre2Regex(const std::string& pattern, const std::string& what, std::string_view original) : what_(what) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &error, &offset, nullptr);
  // PCRE2's offset is into the translated expression, so it is not shown.
  GA_CHECK(code != nullptr, "{} {} does not compile: {}", what,
           quote_pattern_start(original.empty() ? std::string_view(pattern) : original), pcre2_message(error));
  code_ = std::shared_ptr<pcre2_real_code_8>(code, pcre2_code_free);
  // Without a JIT (or when it cannot take the expression) pcre2_match interprets.
  std::size_t jit_size = 0;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0 &&
         pcre2_pattern_info(code, PCRE2_INFO_JITSIZE, &jit_size) == 0 && jit_size > 0;
}

std::optional<std::pair<std::size_t, std::size_t>> Pcre2Regex::find(std::string_view text, std::size_t start) const {
  pcre2_match_data* data = thread_match_data();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // pcre2_jit_match skips pcre2_match's checks (the text is valid UTF-8): a
  // tenth of the pre-tokenizer's time on GPT-2's short pieces.
  int rc = jit_ ? pcre2_jit_match(code_.get(), subject, text.size(), start, 0, data, nullptr)
                : pcre2_match(code_.get(), subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    // The JIT's stack is small (32 KiB); the interpreter keeps its backtracking on the heap.
    rc = pcre2_match(code_.get(), subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data, nullptr);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return std::nullopt;
  GA_CHECK(rc >= 0, "{}: matching a text of {} bytes failed: {}", what_, text.size(), pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  return std::make_pair(static_cast<std::size_t>(ovector[0]), static_cast<std::size_t>(ovector[1]));
}

std::size_t Pcre2Regex::next_character(std::string_view text, std::size_t at) const {
  return at >= text.size() ? text.size() + 1 : at + std::min(utf8_length(text[at]), text.size() - at);
}

}  // namespace gradaccum::data
