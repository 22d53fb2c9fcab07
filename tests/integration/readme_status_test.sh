#!/usr/bin/env bash
# README's status table cannot name a test that does not exist: every `name` in its cells must be a
# ctest name registered by tests/**/CMakeLists.txt (loops over np expanded), a GoogleTest case
# `Suite.Case` defined in tests/ (TEST, TEST_F or TEST_P), a gtest program tests/<name>.cpp, or a
# path in the source tree. Each cell starts with proven, compiled only or refused; a proven cell names
# a test; no GPU cell says proven (nothing has run on a GPU). The checker first proves it can fail:
# a copy of the table with a made-up test name, and one with a GPU cell marked proven, must fail.
# Usage: readme_status_test.sh <source dir>
set -u
src=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

checker() {  # README -> exit 0 when the table holds
  /usr/bin/python3 - "$1" "$src" <<'PY'
import glob, os, re, sys
readme, src = sys.argv[1], sys.argv[2]

# ctest names: add_test(NAME x ...), mt_mpi_test(x ...), mt_mpi_fault_test(mode np ...),
# mt_sim_trainer_test(x) (mpi_sim_x_np2), with the
# variables of enclosing foreach loops expanded.
ctest = set()
for cm in glob.glob(os.path.join(src, "tests", "**", "CMakeLists.txt"), recursive=True):
    loops = []  # (var, values)
    for line in open(cm):
        line = line.split("#", 1)[0]
        m = re.match(r"\s*foreach\((\w+)\s+([^)]*)\)", line)
        if m:
            loops.append((m.group(1), m.group(2).split()))
            continue
        if re.match(r"\s*endforeach\b", line):
            if loops:
                loops.pop()
            continue
        names = []
        for m in re.finditer(r"add_test\(NAME\s+(\S+)", line):
            names.append(m.group(1))
        m = re.match(r"\s*mt_mpi_test\((\S+)", line)
        if m:
            names.append(m.group(1))
        m = re.match(r"\s*mt_sim_trainer_test\((\w+)\)", line)
        if m:
            names.append("mpi_sim_%s_np2" % m.group(1))
        m = re.match(r"\s*mt_mpi_fault_test\((\w+)\s+(\w+)", line)
        if m:
            names.append("mpi_fault_%s_np%s" % (m.group(1), m.group(2)))
        for n in names:
            expanded = [n]
            for var, values in loops:
                if "${%s}" % var in n:
                    expanded = [e.replace("${%s}" % var, v) for e in expanded for v in values]
            ctest.update(e for e in expanded if "$" not in e)

cases = set()
for f in glob.glob(os.path.join(src, "tests", "**", "*.cpp"), recursive=True):
    for m in re.finditer(r"^TEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\)", open(f, errors="replace").read(), re.M):
        cases.add(m.group(1) + "." + m.group(2))

def exists(name):
    if "/" in name:
        return os.path.exists(os.path.join(src, name))
    if re.fullmatch(r"\w+\.\w+", name):
        return name in cases
    if re.fullmatch(r"test_\w+", name) and os.path.exists(os.path.join(src, "tests", name + ".cpp")):
        return True
    return name in ctest

lines = open(readme).read().split("\n")
header = "| capability | CPU backend | simulated device | GPU |"
if header not in lines:
    print("FAIL README has no status table (header %r)" % header)
    sys.exit(1)
i = lines.index(header) + 2
errors, rows, named = [], 0, 0
while i < len(lines) and lines[i].startswith("|"):
    cells = [c.strip() for c in lines[i].strip().strip("|").split(" | ")]
    rows += 1
    if len(cells) != 4:
        errors.append("row %r: %d cells, expected 4" % (lines[i][:60], len(cells)))
    else:
        for col, cell in zip(("CPU backend", "simulated device", "GPU"), cells[1:]):
            where = "%s / %s" % (cells[0], col)
            if not re.match(r"(proven|compiled only|refused)\b", cell):
                errors.append("%s: starts with neither proven, compiled only nor refused: %r" % (where, cell[:40]))
            if col == "GPU" and "proven" in cell:
                errors.append("%s: says proven, but nothing has run on a GPU" % where)
            tests = [t for t in re.findall(r"`([^`]+)`", cell)
                     if re.fullmatch(r"[\w./]+", t) and not t.startswith(("-", "scripts/", "docs/"))]
            if cell.startswith("proven") and not tests:
                errors.append("%s: proven, but names no test" % where)
            for t in tests:
                named += 1
                if not exists(t):
                    errors.append("%s: names `%s`, which is no ctest name, test case or test file" % (where, t))
    i += 1
if rows < 10:
    errors.append("the table has %d rows, expected one per capability (10 or more)" % rows)
for e in errors:
    print("FAIL " + e)
print("%d rows, %d test names checked against %d ctest names and %d test cases" % (rows, named, len(ctest), len(cases)))
sys.exit(1 if errors else 0)
PY
}

fails=0
# The checker can fail: a made-up name, then a GPU cell marked proven.
sed '0,/| proven: `mpi_dp_np2`/s//| proven: `mpi_dp_np2`, `mpi_dp_np99`/' "$src/README.md" >"$work/bad_name.md"
if checker "$work/bad_name.md" | grep -q 'mpi_dp_np99'; then echo "ok   a made-up test name fails the check"
else echo "FAIL a made-up test name passed the check"; fails=$((fails + 1)); fi
awk '/^\| capability \| CPU backend/ { t = 1 } t && /\| compiled only \|$/ && !done { sub(/\| compiled only \|$/, "| proven: `cli_plan` |"); done = 1 } { print }' \
  "$src/README.md" >"$work/bad_gpu.md"
if checker "$work/bad_gpu.md" | grep -q 'nothing has run on a GPU'; then echo "ok   a GPU cell marked proven fails the check"
else echo "FAIL a GPU cell marked proven passed the check"; fails=$((fails + 1)); fi

if checker "$src/README.md"; then echo "ok   README status table"; else fails=$((fails + 1)); fi
exit $((fails > 0))
