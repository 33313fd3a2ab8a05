// UTF-8 scanning helpers for the tokenizer: one char at a time, with Unicode's maximal-subpart rule.
#pragma once

#include <cstdint>
#include <string_view>

namespace ds::tok {

struct Utf8Char {
  uint32_t cp = 0;  // the code point (valid chars only)
  uint8_t len = 1;  // bytes consumed: the char, or the maximal invalid subpart (>= 1)
  bool valid = false;
  bool truncated = false;  // invalid only because the text ends inside a char that could still complete
};

// Decodes the char at text[pos] (pos < size). Rejects overlongs, surrogates and code points > U+10FFFF.
// An invalid sequence consumes its maximal subpart (Unicode 15, section 3.9): e.g. E4 B8 41 -> the
// invalid subpart E4 B8 (2 bytes), then 41.
inline Utf8Char utf8_next(std::string_view text, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  const size_t n = text.size() - pos;
  const unsigned char b0 = p[0];
  Utf8Char r;
  if (b0 < 0x80) {
    r.cp = b0;
    r.valid = true;
    return r;
  }
  int need;                            // continuation bytes
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    r.cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    r.cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    r.cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return r;  // 80..C1, F5..FF: never valid, one byte
  }
  for (int i = 1; i <= need; ++i) {
    if (static_cast<size_t>(i) >= n) {
      r.len = static_cast<uint8_t>(i);
      r.truncated = true;
      return r;
    }
    unsigned char b = p[i];
    if (b < lo || b > hi) {
      r.len = static_cast<uint8_t>(i);
      return r;
    }
    lo = 0x80;
    hi = 0xBF;
    r.cp = (r.cp << 6) | (b & 0x3F);
  }
  r.len = static_cast<uint8_t>(need + 1);
  r.valid = true;
  return r;
}

// Python's str.isspace(): Unicode White_Space plus the separators U+001C..U+001F (bidi class B/S).
inline bool python_isspace(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace ds::tok
