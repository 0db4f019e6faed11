// Regular expressions for the tokenizer's pre-tokenizers, run by PCRE2 (Debian's
// libpcre2-8) in UTF and UCP mode, and the translation of Hugging Face
// tokenizers' expressions (Oniguruma's Ruby syntax) into PCRE2's.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

struct pcre2_real_code_8;  // pcre2_code of <pcre2.h>, kept out of this header

namespace gradaccum::data {

// A compiled expression. Matching is thread-safe; copies share the compiled code.
class Pcre2Regex {
 public:
  // pattern is PCRE2 syntax, compiled with UTF, UCP and MULTILINE (Ruby's ^ and $
  // are line anchors), JIT-compiled where PCRE2 has a JIT. what names the
  // expression's origin in errors, e.g. "tokenizer file X: pre_tokenizer Split
  // pattern", and original is the expression as its file wrote it (before
  // pcre2_from_oniguruma; empty: pattern itself). One that does not compile is a
  // gradaccum::Error "<what> "<original's first characters>" does not compile:
  // <PCRE2's reason>".
  Pcre2Regex(const std::string& pattern, const std::string& what, std::string_view original = {});

  // The leftmost match in text at or after byte offset start, as byte offsets
  // [begin, end). text must be valid UTF-8 (it is not checked again) and start
  // a character boundary.
  std::optional<std::pair<std::size_t, std::size_t>> find(std::string_view text, std::size_t start) const;

  // Calls on_match(begin, end) for every match in text, in the order Hugging Face
  // tokenizers finds them (the onig crate's find_iter, after Rust's regex): each
  // search starts where the last match ended; after an empty match the next
  // search starts one character later, and an empty match right where the
  // previous match ended is skipped.
  template <typename OnMatch>
  void for_each_match(std::string_view text, OnMatch&& on_match) const;

 private:
  std::size_t next_character(std::string_view text, std::size_t at) const;

  std::shared_ptr<pcre2_real_code_8> code_;
  bool jit_ = false;  // JIT-compiled: matched by pcre2_jit_match
  std::string what_;
};

// An expression of a tokenizer.json (Oniguruma, Ruby syntax, which Hugging Face
// tokenizers uses) in PCRE2's syntax with the same meaning:
//  - \s and \S are Unicode's White_Space (PCRE2's \s adds U+180E), \w and \W
//    letters, marks, numbers and connector punctuation (PCRE2's lack marks and
//    most of Pc), \h and \H hexadecimal digits (PCRE2's are horizontal space);
//  - a class inside a class is their union (BLOOM's [^(\s|[.,!?…])]), which
//    PCRE2 reads as a literal '[';
//  - the option m of (?m) and (?m:...) is PCRE2's s (dot matches newline);
//  - \uHHHH is \x{HHHH}, {,n} is {0,n}.
// What has no faithful translation throws gradaccum::Error "<what> "<first
// characters>": <the construct> is not supported": \b and \B (they depend on
// PCRE2's \w), class intersection (&&), a negated class or \S, \W, \H inside a class.
std::string pcre2_from_oniguruma(std::string_view pattern, const std::string& what);

// The first characters of an expression for error messages, quoted as JSON:
// at most 40 characters, then "...".
std::string quote_pattern_start(std::string_view pattern);

template <typename OnMatch>
void Pcre2Regex::for_each_match(std::string_view text, OnMatch&& on_match) const {
  std::size_t start = 0;
  std::optional<std::size_t> last_match_end;
  while (start <= text.size()) {
    const auto match = find(text, start);
    if (!match) return;
    const auto [begin, end] = *match;
    if (begin == end) {
      start = next_character(text, end);
      if (last_match_end == end) continue;
    } else {
      start = end;
    }
    last_match_end = end;
    on_match(begin, end);
  }
}

}  // namespace gradaccum::data
