#include "data/pretokenize.h"

#include <array>

namespace mt::data {

namespace {

constexpr uint32_t kInvalid = 0xFFFFFFFFu;

struct Range {
  uint32_t lo, hi;
};

// Non-ASCII whitespace (Unicode White_Space).
constexpr Range kSpace[] = {{0x85, 0x85},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                            {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}};
// Common \p{N} blocks: Latin-1 superscripts and fractions, decimal digits of the major scripts,
// super/subscripts, number forms, enclosed numerals, fullwidth digits.
constexpr Range kNumber[] = {{0xB2, 0xB3},     {0xB9, 0xB9},     {0xBC, 0xBE},     {0x660, 0x669},
                             {0x6F0, 0x6F9},   {0x7C0, 0x7C9},   {0x966, 0x96F},   {0x9E6, 0x9EF},
                             {0xA66, 0xA6F},   {0xAE6, 0xAEF},   {0xB66, 0xB6F},   {0xBE6, 0xBEF},
                             {0xC66, 0xC6F},   {0xCE6, 0xCEF},   {0xD66, 0xD6F},   {0xE50, 0xE59},
                             {0xED0, 0xED9},   {0xF20, 0xF33},   {0x1040, 0x1049}, {0x17E0, 0x17E9},
                             {0x1810, 0x1819}, {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089},
                             {0x2150, 0x2189}, {0x2460, 0x249B}, {0x24EA, 0x24FF}, {0x2776, 0x2793},
                             {0x3007, 0x3007}, {0x3021, 0x3029}, {0xFF10, 0xFF19}, {0x1D7CE, 0x1D7FF}};
// Punctuation, symbols, marks and controls that are neither \p{L} nor \p{N} (the letter-like
// exceptions inside these blocks are rare enough to ignore).
constexpr Range kOther[] = {{0x80, 0xBF},       {0xD7, 0xD7},     {0xF7, 0xF7},     {0x2C2, 0x2C5},
                            {0x2D2, 0x2DF},     {0x300, 0x36F},   {0x37E, 0x37E},   {0x387, 0x387},
                            {0x483, 0x489},     {0x55A, 0x55F},   {0x589, 0x58A},   {0x591, 0x5C7},
                            {0x600, 0x61F},     {0x64B, 0x65F},   {0x66A, 0x66D},   {0x6D4, 0x6D4},
                            {0x900, 0x903},     {0x93A, 0x94F},   {0x964, 0x965},   {0xE31, 0xE31},
                            {0xE34, 0xE3F},     {0xE47, 0xE4F},   {0x2000, 0x2BFF}, {0x2E00, 0x2E7F},
                            {0x3000, 0x303F},   {0x30FB, 0x30FB}, {0xD800, 0xF8FF}, {0xFE00, 0xFE4F},
                            {0xFF00, 0xFF0F},   {0xFF1A, 0xFF20}, {0xFF3B, 0xFF40}, {0xFF5B, 0xFF65},
                            {0xFFF0, 0xFFFF},   {0x1F000, 0x1FAFF}, {0xE0000, 0x10FFFF}};

template <size_t N>
bool in(const Range (&table)[N], uint32_t cp) {
  for (const Range& r : table)
    if (cp >= r.lo && cp <= r.hi) return true;
  return false;
}

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
  if (cp == kInvalid) return CharClass::other;
  if (in(kSpace, cp)) return CharClass::space;
  if (in(kNumber, cp)) return CharClass::number;
  if (cp == 0xAA || cp == 0xB5 || cp == 0xBA) return CharClass::letter;  // ª µ º inside Latin-1 punctuation
  if (in(kOther, cp)) return CharClass::other;
  return CharClass::letter;
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

}  // namespace mt::data
