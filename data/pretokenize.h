// GPT-2 style pre-tokenization: GPT-2's split pattern written out as a scanner.
//
// GPT-2 (Radford et al. 2019, the released encoder) splits text before BPE with the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// so merges never cross a word boundary and a single space is glued to the word after it.
// pretokenize() reproduces its leftmost-alternative semantics:
//   - an apostrophe followed by s, t, re, ve, m, ll or d (lowercase) is its own piece;
//   - an optional ASCII space plus a run of letters, or of digits, or of other non-space characters;
//   - a whitespace run followed by a non-space loses its last character (which then starts the next
//     piece, e.g. " word"); a run at the end of the text, or of length one, is one piece.
// The classes are Unicode's, as Python's `regex` module (which GPT-2 uses) defines them, looked up
// in ICU: letter = general category L*, number = N*, space = the White_Space property (\s), other =
// the rest (combining marks M*, punctuation, symbols, controls, unassigned). ASCII is classed by a
// table without a look-up. tests/test_data_pretokenize_unicode.cpp checks every code point against
// the Unicode data files and whole texts against GPT-2's own tokenization.
// Bytes that are not valid UTF-8 count as "other" characters one byte long, so any byte string is
// split without error, and the pieces always concatenate back to the input.
#pragma once
#include <cstdint>
#include <string>
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
// Names the splitting rules and the Unicode version of their classes ("gpt2, Unicode 15.0"): data
// prepared under other rules is stale, so data prepare keys its outputs on it.
std::string pretokenizer_id();

}  // namespace mt::data
