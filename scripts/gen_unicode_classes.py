#!/usr/bin/env python3
"""Reference character classes of GPT-2's pre-tokenization pattern, from the Unicode data files.

GPT-2 splits text with
  's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
run by Python's `regex` module, where \\p{L} is general category L*, \\p{N} is N*, and \\s is the
Unicode White_Space property. Every code point therefore falls in one of four classes:
  L  letter      general category Lu, Ll, Lt, Lm, Lo
  N  number      Nd, Nl, No
  S  whitespace  White_Space (PropList.txt); none of these is a letter or a number
  O  other       everything else, unassigned code points and surrogates included

The classes are read from UnicodeData.txt (general categories; "<..., First>"/"<..., Last>" pairs
cover ranges such as CJK ideographs and Hangul syllables) and PropList.txt (White_Space), and
written as ranges "FIRST LAST CLASS" (hex) covering U+0000..U+10FFFF, one range per line. The
header names the Unicode version, which the C++ test compares with its Unicode library's.

--check-regex also asks the `regex` module (Debian python3-regex) for the class of every code
point and fails on any difference, to confirm that the table is what GPT-2's pattern does (it needs
a `regex` built on the same Unicode version).

Usage: /usr/bin/python3 scripts/gen_unicode_classes.py --out tests/fixtures/unicode_classes.txt
       [--ucd /usr/share/unicode] [--check-regex]
(Debian package unicode-data provides /usr/share/unicode.)
"""
import argparse
import os
import re
import sys

MAX_CP = 0x10FFFF


def read_version(ucd):
    with open(os.path.join(ucd, "ReadMe.txt"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"Version (\d+\.\d+)\.\d+ of the Unicode Standard", text)
    if not m:
        m = re.search(r"/Public/(\d+\.\d+)\.\d+/", text)
    if not m:
        sys.exit(f"{ucd}/ReadMe.txt: cannot find the Unicode version")
    return m.group(1)


def general_categories(ucd):
    """Returns a list of MAX_CP + 1 two-letter categories ("Cn" where unassigned)."""
    cat = ["Cn"] * (MAX_CP + 1)
    first = None
    with open(os.path.join(ucd, "UnicodeData.txt"), encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split(";")
            cp, name, gc = int(fields[0], 16), fields[1], fields[2]
            if name.endswith(", First>"):
                first = cp
                continue
            if name.endswith(", Last>"):
                for c in range(first, cp + 1):
                    cat[c] = gc
                first = None
                continue
            cat[cp] = gc
    return cat


def white_space(ucd):
    ws = set()
    with open(os.path.join(ucd, "PropList.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line:
                continue
            cps, prop = [x.strip() for x in line.split(";")]
            if prop != "White_Space":
                continue
            lo, _, hi = cps.partition("..")
            ws.update(range(int(lo, 16), int(hi or lo, 16) + 1))
    return ws


def classes(ucd):
    cat = general_categories(ucd)
    ws = white_space(ucd)
    out = []
    for cp in range(MAX_CP + 1):
        gc = cat[cp]
        if gc[0] == "L":
            k = "L"
        elif gc[0] == "N":
            k = "N"
        elif cp in ws:
            k = "S"
        else:
            k = "O"
        if cp in ws and k != "S":
            sys.exit(f"U+{cp:04X} is White_Space and {gc}: the four classes would overlap")
        out.append(k)
    return out


def check_with_regex(cls):
    import regex

    letter, number, space = regex.compile(r"\p{L}"), regex.compile(r"\p{N}"), regex.compile(r"\s")
    bad = []
    for cp in range(MAX_CP + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue  # not representable in a UTF-8 text
        ch = chr(cp)
        k = "L" if letter.match(ch) else "N" if number.match(ch) else "S" if space.match(ch) else "O"
        if k != cls[cp]:
            bad.append(f"U+{cp:04X} regex {k} table {cls[cp]}")
    if bad:
        sys.exit(f"regex module disagrees on {len(bad)} code points, e.g. " + "; ".join(bad[:5]))
    print("regex module agrees on every code point")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ucd", default="/usr/share/unicode")
    ap.add_argument("--check-regex", action="store_true")
    args = ap.parse_args()
    version = read_version(args.ucd)
    cls = classes(args.ucd)
    if args.check_regex:
        check_with_regex(cls)
    ranges = []
    for cp, k in enumerate(cls):
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp, k])
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"# unicode {version}\n")
        f.write("# GPT-2 pre-tokenization classes (L letter, N number, S White_Space, O other) of every code\n")
        f.write("# point, as ranges FIRST LAST CLASS in hex. Written by scripts/gen_unicode_classes.py.\n")
        for lo, hi, k in ranges:
            f.write(f"{lo:04X} {hi:04X} {k}\n")
    os.replace(tmp, args.out)
    counts = {k: cls.count(k) for k in "LNSO"}
    print(f"{args.out}: Unicode {version}, {len(ranges)} ranges, classes {counts}")


if __name__ == "__main__":
    main()
