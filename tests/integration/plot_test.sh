#!/usr/bin/env bash
# scripts/plot.py on real runs: a single-rank run (loss, validation, throughput, memory, noise scale)
# and, with MPI, a two-stage pipeline run (its bubble, and with trace=1 its timeline) plotted side by side; every figure the runs
# have data for is a PNG, none is drawn for data they lack (no mixture of experts here); a torn last
# line is skipped, a malformed one is an error naming the file and line.
# Usage: plot_test.sh <minitrain> <plot.py>
set -u
mt=$1
plot=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fails=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
tiny=(data.path=synthetic model.vocab_size=128 model.n_layer=2 model.n_embd=32 model.n_head=4 seq_len=16
      batch_size=2 steps=6 threads=1 log_every=100)
"$mt" train "${tiny[@]}" grad_accum=2 eval_every=3 out_dir="$work/single" 2>"$work/single.log" ||
  { echo "FAIL single-rank run"; tail -5 "$work/single.log"; exit 1; }
runs=("$work/single")
pipeline=0
if [[ "$("$mt" --version)" == *"MPI on"* ]]; then
  mpirun --oversubscribe --mca btl self,vader --mca pml ob1 -np 2 "$mt" train "${tiny[@]}" --pp 2 grad_accum=2 trace=1 \
    out_dir="$work/pp2" 2>"$work/pp2.log" || { echo "FAIL pipeline run"; tail -5 "$work/pp2.log"; exit 1; }
  runs+=("$work/pp2")
  pipeline=1
fi
/usr/bin/python3 "$plot" "${runs[@]}" --out "$work/plots" >"$work/plot.out" 2>&1 || { echo "FAIL plot.py"; cat "$work/plot.out"; exit 1; }
png() { [[ -f "$1" && "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" == 89504e470d0a1a0a ]]; }
for f in loss throughput memory noise; do
  check "$f.png written and named" "png '$work/plots/$f.png' && grep -qx '$work/plots/$f.png' '$work/plot.out'"
done
check "no moe.png without mixture-of-experts data" "[[ ! -e '$work/plots/moe.png' ]]"
if [[ $pipeline == 1 ]]; then
  check "pipeline.png from the pp run" "png '$work/plots/pipeline.png'"
  check "timeline.png from the pp run's trace" "png '$work/plots/timeline.png'"
else
  echo "skip pipeline.png (this build has no MPI)"
fi
# A torn last line (a killed run) is skipped; a malformed line in the middle is an error.
cp "$work/single/metrics.jsonl" "$work/torn.jsonl" && printf '{"step": 7, "lo' >>"$work/torn.jsonl"
check "torn last line skipped" "/usr/bin/python3 '$plot' '$work/torn.jsonl' --out '$work/torn' >/dev/null 2>&1 && png '$work/torn/loss.png'"
{ head -2 "$work/single/metrics.jsonl"; echo "not json"; tail -1 "$work/single/metrics.jsonl"; } >"$work/bad.jsonl"
/usr/bin/python3 "$plot" "$work/bad.jsonl" --out "$work/bad" >"$work/bad.out" 2>&1
rc=$?
check "malformed line: exit 1 naming file and line" "[[ $rc -ne 0 ]] && grep -q 'bad.jsonl:3: not JSON' '$work/bad.out'"
check "a run without metrics: one line" "! /usr/bin/python3 '$plot' '$work/nothing' 2>&1 | grep -q Traceback"
exit $((fails > 0))
