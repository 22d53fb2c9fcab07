#!/usr/bin/env bash
# Measured against simulated pipeline bubble, and tokens/s, of every schedule for pp = 2, 4 and
# grad_accum (micro-batches) m = 4, 8, on a balanced model (8 layers cut evenly: 4 or 2 per rank, or
# 2 chunks of 2 or 1 under interleaved; a small vocabulary, so the embedding and the classifier add
# little to the first and last stage). One thread per rank, CPU, under mpirun --oversubscribe.
#
# measured:  pp.bubble from metrics.jsonl (each rank's idle share of its run of the schedule, the mean
#            over the pp ranks), averaged over the steps after `warm` warm-up steps.
# simulated: `minitrain plan`'s bubble of the step, with equal costs F = B_input = W = 1 (a full
#            backward costs 2 F) and no latency. The measured F and B (zb1: B_input + W) per chunk and micro-batch are
#            printed beside it; with equal stages the F : B ratio does not change the bubble of
#            gpipe and 1f1b ((p-1)/(m+p-1) for any costs).
# Idle time is only meaningful while every rank has a core: with more ranks than cores the ranks
# take turns, and a rank waiting for the OS to run it looks busy or idle at random.
# Usage: [schedules="1f1b zb1"] scripts/pp_bubble.sh [minitrain] [steps] [warm]   (default build-nocuda/minitrain 6 2,
#        every schedule)
set -euo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
mt=${1:-$root/build-nocuda/minitrain}
steps=${2:-6}
warm=${3:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi=(mpirun --oversubscribe --mca btl self,vader --mca pml ob1)
model=(model=tiny model.vocab_size=256 model.n_layer=8 model.n_embd=128 model.n_head=4 model.block_size=64
       seq_len=64 batch_size=4 threads=1 data.path=synthetic peak_flops=1e11 log_every=1000 optim.warmup_steps=2)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '| pp | m | schedule | measured bubble | simulated bubble | F, B per chunk (ms) | tokens/s |\n'
printf '|---|---|---|---|---|---|---|\n'
for p in 2 4; do
  for m in 4 8; do
    for sched in ${schedules:-gpipe 1f1b interleaved zb1}; do
      v=1
      [[ $sched == interleaved ]] && v=2
      out="$work/p${p}_m${m}_$sched"
      "${mpi[@]}" -np "$p" "$mt" train "${model[@]}" --pp "$p" pp.schedule="$sched" pp.virtual="$v" \
        grad_accum="$m" steps="$steps" out_dir="$out" 2>"$out.err" >/dev/null ||
        { echo "pp_bubble.sh: pp=$p m=$m $sched failed:" >&2; tail -5 "$out.err" >&2; exit 1; }
      sim=$("$mt" plan pp="$p" grad_accum="$m" pp.schedule="$sched" pp.virtual="$v" |
            awk '/^bubble of the step:/ {print $6; exit}')
      /usr/bin/python3 - "$out/metrics.jsonl" "$p" "$m" "$sched" "$sim" "$warm" <<'PY'
import json, sys
path, p, m, sched, sim, warm = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6])
rows = [json.loads(l) for l in open(path) if '"loss"' in l][warm:]
mean = lambda xs: sum(xs) / len(xs)
bubble = mean([r["pp"]["bubble"] for r in rows])
f = mean([r["pp"]["forward_s"] for r in rows]) * 1e3
b = mean([r["pp"]["backward_s"] for r in rows]) * 1e3
tok = mean([r["tokens_per_s"] for r in rows])
print(f"| {p} | {m} | {sched} | {bubble:.3f} | {sim:.3f} | {f:.1f}, {b:.1f} | {tok:.0f} |")
PY
    done
  done
done
