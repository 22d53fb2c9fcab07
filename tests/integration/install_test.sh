#!/usr/bin/env bash
# `cmake --install` (cmake/install.cmake) into a temporary prefix, then minitrain used from there
# alone: --version, a short supervised training run, and `minitrain plot`, which finds the plotting
# script beside the installed binary (a copy of the prefix finds its own; a symlink on PATH finds the
# prefix's; the build's binary finds the source tree's). A prefix that cannot be written (for root
# too: under /proc, or under a regular file) fails with one line naming it and copies nothing.
# Usage: install_test.sh <build dir> <source dir>
set -u
build=$(realpath "$1")
src=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
fails=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

p=$work/prefix
cmake --install "$build" --prefix "$p" >"$work/install.log" 2>&1
rc=$?
check "cmake --install --prefix <tmp> (status $rc)" "[[ $rc == 0 ]]" || cat "$work/install.log"
for f in bin/minitrain bin/minitrain-supervise share/minitrain/plot.py share/minitrain/slurm.sbatch; do
  check "installed $f, executable" "[[ -x '$p/$f' ]]"
done
for f in README.md docs/launch.md docs/architecture.md docs/guide.md; do
  check "installed share/doc/minitrain/$f" "[[ -f '$p/share/doc/minitrain/$f' ]]"
done
check "no probe file left in the prefix" "[[ ! -e '$p/.minitrain-install-probe' ]]"

# Used from the prefix, from a directory outside the source tree.
mkdir "$work/use" && cd "$work/use" || exit 1
check "installed minitrain --version" "'$p/bin/minitrain' --version | grep -q '^minitrain '"
"$p/bin/minitrain-supervise" --ckpt-dir run/checkpoints --metrics run/metrics.jsonl -- \
  "$p/bin/minitrain" train data.path=synthetic model.vocab_size=128 model.n_layer=2 model.n_embd=32 model.n_head=4 \
  seq_len=16 batch_size=2 steps=4 save_every=2 log_every=100 threads=1 out_dir=run >"$work/train.log" 2>&1
rc=$?
check "installed minitrain-supervise runs installed minitrain train (status $rc)" \
  "[[ $rc == 0 && -f run/model.safetensors && -d run/checkpoints/step_000004 ]]" || tail -5 "$work/train.log"
check "installed minitrain plot --help names the installed script" \
  "'$p/bin/minitrain' plot --help | grep -qx '  script: $p/share/minitrain/plot.py'"
"$p/bin/minitrain" plot run --out plots >"$work/plot.log" 2>&1
rc=$?
check "installed minitrain plot draws the run (status $rc)" "[[ $rc == 0 && -s plots/loss.png ]]" || tail -5 "$work/plot.log"
cp -a "$p" "$work/copy"
check "a copy of the prefix finds its own script (relative to the binary)" \
  "'$work/copy/bin/minitrain' plot --help | grep -qx '  script: $work/copy/share/minitrain/plot.py'"
mkdir "$work/onpath" && ln -s "$p/bin/minitrain" "$work/onpath/minitrain"
check "a symlink on PATH finds the prefix's script" \
  "PATH='$work/onpath':\$PATH minitrain plot --help | grep -qx '  script: $p/share/minitrain/plot.py'"
check "the build's binary finds the source tree's script" \
  "'$build/minitrain' plot --help | grep -qx '  script: $src/scripts/plot.py'"
rm "$work/copy/share/minitrain/plot.py"
check "plot without its script beside the binary falls back to the source tree" \
  "'$work/copy/bin/minitrain' plot --help | grep -qx '  script: $src/scripts/plot.py'"
"$p/bin/minitrain" plot >/dev/null 2>"$work/usage.txt"
rc=$?
check "minitrain plot without runs: usage on stderr, status 2 (status $rc)" "[[ $rc == 2 ]] && grep -q '^usage: minitrain plot' '$work/usage.txt'"

# Prefixes that cannot be written, even by root.
touch "$work/a_file"
for bad in /proc/minitrain-install-test "$work/a_file/prefix"; do
  cmake --install "$build" --prefix "$bad" >"$work/bad.log" 2>&1
  rc=$?
  check "prefix $bad: refused (status $rc), one line naming it, nothing copied" \
    "[[ $rc != 0 ]] && [[ \$(grep -c 'minitrain: cannot install into' '$work/bad.log') == 1 ]] &&
     grep -q \"into '$bad'\" '$work/bad.log' && ! grep -q 'Installing:' '$work/bad.log' &&
     ! grep -qi 'cannot create directory' '$work/bad.log'"
done
check "the refusal's line is whole (not wrapped)" \
  "grep -q \"minitrain: cannot install into '$work/a_file/prefix': it cannot be created or written (give a writable --prefix)\" '$work/bad.log'"

exit $((fails > 0))
