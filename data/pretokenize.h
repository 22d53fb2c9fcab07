// GPT-2 style pre-tokenization, written out by hand instead of with a regex engine.
//
// GPT-2 (Radford et al. 2019, the released encoder) splits text before BPE with the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// so merges never cross a word boundary and a single space is glued to the word after it.
// pretokenize() reproduces its leftmost-alternative semantics:
//   - an apostrophe followed by s, t, re, ve, m, ll or d (lowercase) is its own piece;
//   - an optional ASCII space plus a run of letters, or of digits, or of other non-space characters;
//   - a whitespace run followed by a non-space loses its last character (which then starts the next
//     piece, e.g. " word"); a run at the end of the text, or of length one, is one piece.
// Letters, digits and whitespace are Unicode classes approximated by compact tables (ASCII exactly;
// beyond ASCII: the common punctuation, symbol, digit and space blocks, everything else a letter).
// Bytes that are not valid UTF-8 count as "other" characters one byte long, so any byte string is
// split without error, and the pieces always concatenate back to the input.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

namespace mt::data {

enum class CharClass : uint8_t { letter, number, space, other };

// Decodes one UTF-8 character at p (n bytes available, n > 0). Returns its length in bytes (1-4)
// and sets cp; an invalid or truncated sequence yields length 1 and cp = 0xFFFFFFFF.
int utf8_next(const unsigned char* p, size_t n, uint32_t& cp);
CharClass char_class(uint32_t cp);

// Appends the pieces of `text` to `out` (views into text, in order, covering it exactly).
void pretokenize(std::string_view text, std::vector<std::string_view>& out);

}  // namespace mt::data
