// libFuzzer target: GPT-2's tokenizer (scripts/setup.sh installs its
// gpt2.tiktoken in /var/lib/gradaccum/gpt2) on arbitrary bytes.
//
// Properties: every id is below id_count(), and decode(encode(bytes)) gives the
// bytes back with each invalid UTF-8 sequence replaced by U+FFFD (the
// tokenizer's documented handling; for valid UTF-8 that is the text itself).
// Any exception, crash or sanitizer report is a finding.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "gradaccum/data/tokenizer.h"
#include "gradaccum/data/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tokenizer = gradaccum::data::Tokenizer::load(gradaccum::data::kDefaultTokenizerDir);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto ids = tokenizer.encode(text);
  for (const auto id : ids) FUZZ_CHECK(static_cast<size_t>(id) < tokenizer.id_count());
  std::string expected;
  for (const char32_t cp : gradaccum::data::decode_utf8(text)) {
    gradaccum::data::append_utf8(expected, cp);
  }
  FUZZ_CHECK(tokenizer.decode(ids) == expected);
  return 0;
}
