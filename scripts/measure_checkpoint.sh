#!/usr/bin/env bash
# What checkpoints cost a whole training run: the same run with no periodic saves, with synchronous
# saves and with asynchronous ones (idle-priority writer with and without the fallback to synchronous
# saves, and a normal-priority writer for comparison), at each
# save interval given, each configuration repeated; the configurations take turns so that load from
# other jobs spreads over all of them. Prints one table: medians over the repeats of
#   whole-run wall time   the process from start to exit (initialisation, steps, saves, the final save
#                         and export, which every configuration has, "none" included);
#   steps' time           the sum of the steps' time.total (metrics.jsonl);
#   slowdown beside writes  for the steps that ran beside a background write ("ckpt_overlap_s"), their
#                         summed time above the median step that ran alone: what the writer cost the
#                         steps (scripts/supervise takes the same amount out of the goodput);
#   blocking / background / writer CPU per save   medians over the saves logged in metrics.jsonl;
#   synchronous saves     of an async run, how many the fallback (ckpt.sync_fallback) wrote in the foreground.
# Usage: scripts/measure_checkpoint.sh [--preset gpt2] [--layers 4] [--batch 4] [--seq 128] [--steps 20]
#          [--every 5,1] [--repeats 3] [--threads 2] [--configs none,sync,async,async-always,async-normal]
set -euo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
preset=gpt2 layers=4 B=4 T=128 steps=20 every=5,1 repeats=3 threads=2 configs=none,sync,async,async-always,async-normal
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || { echo "measure_checkpoint: $1 needs a value" >&2; exit 2; }
  case "$1" in
    --preset) preset=$2 ;; --layers) layers=$2 ;; --batch) B=$2 ;; --seq) T=$2 ;; --steps) steps=$2 ;;
    --every) every=$2 ;; --repeats) repeats=$2 ;; --threads) threads=$2 ;; --configs) configs=$2 ;;
    *) echo "measure_checkpoint: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift 2
done
mt="${MT_BUILD_DIR:-$root/build}/minitrain"
py=/usr/bin/python3
work=$(mktemp -d "${MT_CKPT_TMP:-$root/build}/ckpt_measure.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The runs: "name save_every extra-options", none once, the others at each interval.
runs=()
IFS=, read -ra config_list <<<"$configs"
IFS=, read -ra every_list <<<"$every"
for c in "${config_list[@]}"; do
  case $c in
    none) runs+=("none 0") ;;
    sync) for e in "${every_list[@]}"; do runs+=("sync $e ckpt.async=false"); done ;;
    async) for e in "${every_list[@]}"; do runs+=("async $e ckpt.async=true ckpt.writer_priority=idle"); done ;;
    async-always) for e in "${every_list[@]}"; do runs+=("async-always $e ckpt.async=true ckpt.writer_priority=idle ckpt.sync_fallback=false"); done ;;
    async-normal) for e in "${every_list[@]}"; do runs+=("async-normal $e ckpt.async=true ckpt.writer_priority=normal ckpt.sync_fallback=false"); done ;;
    *) echo "measure_checkpoint: unknown configuration '$c' (none, sync, async, async-always, async-normal)" >&2; exit 2 ;;
  esac
done

echo "measure_checkpoint: $preset with $layers layers, B=$B T=$T, $steps steps, $threads threads, $repeats repeats, $(date -u +%Y-%m-%dT%H:%MZ), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq 1 "$repeats"); do
  for i in "${!runs[@]}"; do
    read -r name e extra <<<"${runs[$i]}"
    out="$work/run$i.$r"
    t0=$(date +%s.%N)
    # peak_flops: skip the calibration GEMM, which would add its own noise to the wall time.
    # shellcheck disable=SC2086
    "$mt" train model="$preset" model.n_layer="$layers" batch_size="$B" seq_len="$T" steps="$steps" \
      save_every="$e" ckpt.keep=2 data.path=synthetic threads="$threads" peak_flops=1e11 log_every=1000 \
      out_dir="$out" $extra 2>"$out.log" || { echo "measure_checkpoint: run failed: ${runs[$i]} (log below)" >&2; cat "$out.log" >&2; exit 1; }
    t1=$(date +%s.%N)
    "$py" - "$out/metrics.jsonl" "$t0" "$t1" >"$work/stats$i.$r" <<'PY'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = {j["step"]: j for j in recs if "loss" in j}
alone = [j["time"]["total"] for j in steps.values() if not j.get("ckpt_overlap_s")]
beside = [j["time"]["total"] for j in steps.values() if j.get("ckpt_overlap_s")]
base = statistics.median(alone) if alone else float("nan")
saves = [j["checkpoint"] for j in recs if "checkpoint" in j]
med = lambda k: statistics.median(s.get(k, 0) for s in saves) if saves else float("nan")
print(float(sys.argv[3]) - float(sys.argv[2]), sum(j["time"]["total"] for j in steps.values()),
      max(0.0, sum(t - base for t in beside)), len(beside), med("blocking_s"), med("background_s"),
      med("writer_cpu_s"), len(saves), sum(1 for s in saves if s.get("synchronous")))
PY
    echo "  $name every $e, run $r: $(cut -d' ' -f1 "$work/stats$i.$r") s" >&2
    rm -rf "$out"
  done
done

printf '| saves | every | whole-run wall, median (each run) | steps'"'"' time | slowdown beside writes (steps) | blocking per save | background per save | writer CPU per save | synchronous saves (each run) |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for i in "${!runs[@]}"; do
  read -r name e _ <<<"${runs[$i]}"
  "$py" - "$name" "$e" "$work"/stats"$i".* <<'PY'
import statistics, sys
name, every, files = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = [list(map(float, open(f).read().split())) for f in files]
med = lambda k: statistics.median(r[k] for r in rows)
each = ", ".join("%.1f" % r[0] for r in rows)
na = lambda x, fmt: "-" if x != x or name == "none" else fmt % x
sync = "-" if not name.startswith("async") else "/".join("%.0f of %.0f" % (r[8], r[7]) for r in rows)
print("| %s | %s | %.1f s (%s) | %.1f s | %.1f s (%.0f) | %s | %s | %s | %s |" % (
    name, "-" if name == "none" else every, med(0), each, med(1), med(2), med(3),
    na(med(4), "%.3f s"), na(med(5), "%.3f s"), na(med(6), "%.3f s"), sync))
PY
done
