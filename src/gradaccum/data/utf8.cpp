#include "gradaccum/data/utf8.h"

namespace gradaccum::data {

std::u32string decode_utf8(std::string_view bytes) {
  constexpr char32_t kReplacement = 0xFFFD;
  std::u32string out;
  out.reserve(bytes.size());
  // The WHATWG decoder's state: the bytes still needed by the current sequence
  // and the allowed range of the next continuation byte (narrower after E0, ED,
  // F0, F4 to reject overlong forms, surrogates and values above U+10FFFF).
  int needed = 0;
  char32_t cp = 0;
  unsigned lower = 0x80, upper = 0xBF;
  std::size_t i = 0;
  while (i < bytes.size()) {
    const unsigned b = static_cast<unsigned char>(bytes[i]);
    if (needed == 0) {
      ++i;
      if (b < 0x80) {
        out.push_back(b);
      } else if (b >= 0xC2 && b <= 0xDF) {
        needed = 1;
        cp = b & 0x1F;
      } else if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) lower = 0xA0;
        if (b == 0xED) upper = 0x9F;
        needed = 2;
        cp = b & 0x0F;
      } else if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) lower = 0x90;
        if (b == 0xF4) upper = 0x8F;
        needed = 3;
        cp = b & 0x07;
      } else {
        out.push_back(kReplacement);
      }
      continue;
    }
    if (b < lower || b > upper) {
      // The sequence so far is one ill-formed subsequence; this byte starts
      // afresh (it is not consumed).
      out.push_back(kReplacement);
      needed = 0;
      lower = 0x80;
      upper = 0xBF;
      continue;
    }
    ++i;
    lower = 0x80;
    upper = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
    if (--needed == 0) out.push_back(cp);
  }
  if (needed != 0) out.push_back(kReplacement);
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    const unsigned b = static_cast<unsigned char>(bytes[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    // The lead byte gives the length and the range of the first continuation
    // byte (narrower after E0, ED, F0, F4), as in decode_utf8.
    std::size_t length = 0;
    unsigned lower = 0x80, upper = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      length = 3;
      if (b == 0xE0) lower = 0xA0;
      if (b == 0xED) upper = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      length = 4;
      if (b == 0xF0) lower = 0x90;
      if (b == 0xF4) upper = 0x8F;
    } else {
      return false;
    }
    if (i + length > bytes.size()) return false;
    for (std::size_t k = 1; k < length; ++k) {
      const unsigned c = static_cast<unsigned char>(bytes[i + k]);
      if (c < lower || c > upper) return false;
      lower = 0x80;
      upper = 0xBF;
    }
    i += length;
  }
  return true;
}

std::string replace_invalid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() + 8);
  for (char32_t cp : decode_utf8(bytes)) append_utf8(out, cp);
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace gradaccum::data
