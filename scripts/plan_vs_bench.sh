#!/usr/bin/env bash
# `minitrain plan`'s predicted step time against the measured one (`minitrain bench`), layout by layout,
# with a hardware file calibrated on this machine the way the runs use it (2 ranks x 1 thread):
#   scripts/plan_vs_bench.sh [MINITRAIN] [HW_FILE] [STEPS]
# Calibrates into HW_FILE when it does not exist, then prints a markdown table: layout, measured
# ms/step (bench's median over STEPS steps after one warm-up), predicted ms/step, predicted/measured,
# and the plan's split (GEMMs, attention, memory-bound ops, optimizer, passes over the gradients,
# communication, bubble).
set -euo pipefail
mt=${1:-build-nocuda/minitrain}
hw=${2:-cpu-calibrated.json}
steps=${3:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpirun=(mpirun --oversubscribe --mca btl self,vader --mca pml ob1 -np 2)
# Calibrated at the runs' shapes: 512 rows per rank (B T / cp for dp and cp; tp's products are
# narrower, pp's micro-batches shorter) and T = 128.
[[ -f $hw ]] || "${mpirun[@]}" "$mt" bench --calibrate out="$hw" rows=512 seq_len=128
# GPT-2's width and heads, two layers and a small vocabulary, so that a step takes seconds.
model=(model=gpt2 model.n_layer=2 model.vocab_size=4096 seq_len=128 threads=1)
layouts=(
  "dp=2 zero=0 batch_size=4"
  "dp=2 zero=3 batch_size=4"
  "tp=2 batch_size=8"
  "pp=2 batch_size=2 grad_accum=4"
  "cp=2 attention=flash batch_size=8"
)
echo "| layout | measured ms/step | predicted ms/step | predicted / measured | plan: GEMMs, attention, memory-bound, optimizer, gradient passes, comm (tp+cp+pp+dp), bubble |"
echo "|---|---:|---:|---:|---|"
for l in "${layouts[@]}"; do
  read -r -a opts <<<"$l"
  measured=$("${mpirun[@]}" "$mt" bench "${model[@]}" "${opts[@]}" steps="$steps" warmup=1 2>/dev/null |
             sed -n 's/^| ms\/step (median) *| \([0-9.]*\) |$/\1/p')
  "$mt" plan "${model[@]}" "${opts[@]}" hw="$hw" --json | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin); t = j["time"]; m = float(sys.argv[2])
comm = t["tp_s"] + t["cp_s"] + t["pp_s"] + t["dp_exposed_s"]
parts = [t[k] for k in ("gemm_s", "attention_s", "memory_bound_s", "optimizer_s", "grad_passes_s")] + [comm]
print("| %s | %.1f | %.1f | %.2f | %s ms, %.3f |" % (sys.argv[1], m, 1e3 * t["step_s"], 1e3 * t["step_s"] / m,
      ", ".join("%.0f" % (1e3 * x) for x in parts), t["bubble_over_ideal"]))' "$l" "$measured"
done
