// UTF-8 decoding and encoding for the tokenizer.
#pragma once

#include <string>
#include <string_view>

namespace gradaccum::data {

// Decodes UTF-8 into code points. Invalid input is never an error: each
// maximal ill-formed subsequence (an unexpected byte, a truncated or overlong
// sequence, an encoded surrogate, a value above U+10FFFF) becomes one U+FFFD,
// exactly as the WHATWG Encoding Standard decoder does (node's
// Buffer.toString('utf8') and TextDecoder, Python's bytes.decode(errors="replace")).
std::u32string decode_utf8(std::string_view bytes);

// Whether bytes are valid UTF-8 (then decode_utf8 replaces nothing).
bool is_valid_utf8(std::string_view bytes);

// bytes with each maximal ill-formed subsequence replaced by U+FFFD, as
// decode_utf8 does: valid UTF-8.
std::string replace_invalid_utf8(std::string_view bytes);

// Appends the UTF-8 encoding of a code point (which must not be a surrogate
// nor above U+10FFFF).
void append_utf8(std::string& out, char32_t cp);

}  // namespace gradaccum::data
