#!/usr/bin/env bash
# Blocking vs background time of checkpoint saves inside real training (gpt2 by default): the same
# run with async and with synchronous saves after every step. Prints one table from metrics.jsonl.
# Usage: scripts/measure_checkpoint.sh [preset] [steps] [B] [T]   (default gpt2 4 4 256)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
preset=${1:-gpt2} steps=${2:-4} B=${3:-4} T=${4:-256}
mt="${MT_BUILD_DIR:-$root/build}/minitrain"
work=$(mktemp -d "${MT_CKPT_TMP:-$root/build}/ckpt_measure.XXXXXX")
trap 'rm -rf "$work"' EXIT
printf '| saves | blocking per save (median) | background per save (median) | bytes per save |\n|---|---|---|---|\n'
for async in true false; do
  "$mt" train model="$preset" batch_size="$B" seq_len="$T" steps="$steps" save_every=1 ckpt.async="$async" \
    ckpt.keep=2 data.path=synthetic out_dir="$work/$async" log_every=1000 2>/dev/null
  /usr/bin/python3 - "$work/$async/metrics.jsonl" "$async" <<'PY'
import json, statistics, sys
saves = [json.loads(l)["checkpoint"] for l in open(sys.argv[1]) if '"checkpoint"' in l]
b = statistics.median(s["blocking_s"] for s in saves)
g = statistics.median(s["background_s"] for s in saves)
kind = "async" if sys.argv[2] == "true" else "sync"
print(f"| {kind} ({len(saves)} logged) | {b:.3f} s | {g:.3f} s | {saves[0]['bytes'] / 2**20:.0f} MiB |")
PY
done
