#!/usr/bin/env bash
# Activation memory (arena peak) and step time for recompute=none|selective|full on one config,
# trained on the default corpus so the data-wait share of the step is measured in the same runs.
# Prints one table. Usage: scripts/measure_recompute.sh [preset] [B] [T] [steps]   (default gpt2 4 256 2)
set -euo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
preset=${1:-gpt2} B=${2:-4} T=${3:-256} steps=${4:-2}
mt="${MT_BUILD_DIR:-$root/build}/minitrain"
data="$root/data_cache/fortunes"
[[ -f "$data/meta.json" ]] || { echo "measure_recompute.sh: run scripts/train.sh once first (prepares $data)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '| recompute | activation peak | step time (last) | data wait share | HFU/MFU |\n|---|---|---|---|---|\n'
for mode in none selective full; do
  "$mt" train model="$preset" batch_size="$B" seq_len="$T" steps="$steps" recompute="$mode" \
    data.path="$data" data.mode=shuffled out_dir="$work/$mode" log_every=1000 2>/dev/null
  /usr/bin/python3 - "$work/$mode/metrics.jsonl" "$mode" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
last = rows[-1]
act = max(r["memory"]["activations"] for r in rows)
data_share = sum(r["time"]["data"] for r in rows) / sum(r["time"]["total"] for r in rows)
print(f"| {sys.argv[2]} | {act / 2**20:.1f} MiB | {last['time']['total']:.2f} s | {100 * data_share:.3f}% | "
      f"{last['hfu'] / last['mfu']:.3f} |")
PY
done
