#include "data/pretokenize.h"

#include <unicode/uchar.h>

#include <array>

namespace mt::data {

namespace {

constexpr uint32_t kInvalid = 0xFFFFFFFFu;

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

constexpr std::array<CharClass, 128> make_ascii_classes() {
  std::array<CharClass, 128> t{};
  for (int c = 0; c < 128; c++) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      t[size_t(c)] = CharClass::letter;
    else if (c >= '0' && c <= '9')
      t[size_t(c)] = CharClass::number;
    else if (c == ' ' || (c >= '\t' && c <= '\r'))
      t[size_t(c)] = CharClass::space;
    else
      t[size_t(c)] = CharClass::other;
  }
  return t;
}
constexpr auto kAsciiClass = make_ascii_classes();

}  // namespace

int utf8_next(const unsigned char* p, size_t n, uint32_t& cp) {
  unsigned char c = p[0];
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  int len;
  uint32_t v, min;
  if ((c & 0xE0) == 0xC0) len = 2, v = c & 0x1F, min = 0x80;
  else if ((c & 0xF0) == 0xE0) len = 3, v = c & 0x0F, min = 0x800;
  else if ((c & 0xF8) == 0xF0) len = 4, v = c & 0x07, min = 0x10000;
  else {
    cp = kInvalid;
    return 1;
  }
  if (n < size_t(len)) {
    cp = kInvalid;
    return 1;
  }
  for (int k = 1; k < len; k++) {
    if (!is_cont(p[k])) {
      cp = kInvalid;
      return 1;
    }
    v = (v << 6) | (p[k] & 0x3F);
  }
  // Overlong forms, UTF-16 surrogates and values past U+10FFFF are not valid UTF-8.
  if (v < min || (v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF) {
    cp = kInvalid;
    return 1;
  }
  cp = v;
  return len;
}

CharClass char_class(uint32_t cp) {
  if (cp < 0x80) return kAsciiClass[cp];
  if (cp > 0x10FFFF) return CharClass::other;  // kInvalid: a byte that is not valid UTF-8
  const auto c = UChar32(cp);
  const uint32_t gc = U_GET_GC_MASK(c);
  if (gc & U_GC_L_MASK) return CharClass::letter;
  if (gc & U_GC_N_MASK) return CharClass::number;
  // White_Space code points are all separators (Z*) or controls (Cc), so others skip the look-up.
  if ((gc & (U_GC_Z_MASK | U_GC_CC_MASK)) && u_isUWhiteSpace(c)) return CharClass::space;
  return CharClass::other;
}

void pretokenize(std::string_view text, std::vector<std::string_view>& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // Class and length of the character at byte i (ASCII, the common case, without decoding).
  auto at = [&](size_t i, int& len) {
    if (s[i] < 0x80) {
      len = 1;
      return kAsciiClass[s[i]];
    }
    uint32_t cp;
    len = utf8_next(s + i, n - i, cp);
    return char_class(cp);
  };
  // End of the run of class `c` starting at byte i.
  auto run_end = [&](size_t i, CharClass c) {
    int len;
    while (i < n && at(i, len) == c) i += size_t(len);
    return i;
  };
  size_t i = 0;
  while (i < n) {
    size_t start = i;
    if (s[i] == '\'' && i + 1 < n) {
      static constexpr std::string_view kContractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
      size_t match = 0;
      for (std::string_view c : kContractions)
        if (text.substr(i, c.size()) == c) {
          match = c.size();
          break;
        }
      if (match) {
        out.push_back(text.substr(i, match));
        i += match;
        continue;
      }
    }
    int len;
    CharClass c = at(i, len);
    if (s[i] == ' ' && i + 1 < n) {
      int len1;
      CharClass c1 = at(i + 1, len1);
      if (c1 != CharClass::space) {  // " ?\p{L}+", " ?\p{N}+" or " ?[^\s\p{L}\p{N}]+" with the space
        i = run_end(i + 1, c1);
        out.push_back(text.substr(start, i - start));
        continue;
      }
    }
    if (c != CharClass::space) {
      i = run_end(i, c);
      out.push_back(text.substr(start, i - start));
      continue;
    }
    // Whitespace: "\s+(?!\S)" takes the run, minus its last character when a non-space follows;
    // "\s+" takes a lone whitespace character before a non-space.
    size_t end = i, last = i;
    while (end < n) {
      int l;
      if (at(end, l) != CharClass::space) break;
      last = end;
      end += size_t(l);
    }
    if (end < n && last > start) end = last;
    out.push_back(text.substr(start, end - start));
    i = end;
  }
}

std::string pretokenizer_id() { return std::string("gpt2, Unicode ") + U_UNICODE_VERSION; }

}  // namespace mt::data
