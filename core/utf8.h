// Strict UTF-8 decoding of one character and encoding of one code point (tokenizers, templates).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

// The code point reported for a byte that does not start a valid UTF-8 sequence.
inline constexpr uint32_t kInvalidCodePoint = 0xFFFFFFFFu;

struct Utf8Char {
  uint32_t cp;  // kInvalidCodePoint for an invalid byte
  size_t len;   // bytes taken: the sequence's length, or 1 for an invalid byte
};

// The character that starts at s[i] (i < s.size()). Overlong forms, surrogates, code points
// above U+10FFFF and truncated or broken sequences are invalid: {kInvalidCodePoint, 1}, so a
// caller that advances by `len` walks invalid input byte by byte.
inline Utf8Char DecodeUtf8At(std::string_view s, size_t i) {
  const uint8_t c = static_cast<uint8_t>(s[i]);
  if (c < 0x80) return {c, 1};
  size_t len;
  uint32_t cp, min_cp;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F, min_cp = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F, min_cp = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07, min_cp = 0x10000;
  } else {
    return {kInvalidCodePoint, 1};
  }
  if (i + len > s.size()) return {kInvalidCodePoint, 1};
  for (size_t k = 1; k < len; ++k) {
    const uint8_t cc = static_cast<uint8_t>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return {kInvalidCodePoint, 1};
    cp = (cp << 6) | (cc & 0x3F);
  }
  if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return {kInvalidCodePoint, 1};
  }
  return {cp, len};
}

// Appends the UTF-8 bytes of `cp` (a valid scalar value, < 0x110000) to `out`.
inline void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace strata
