#!/usr/bin/env bash
# Load balancing of a mixture of experts on the default corpus: the same tiny MoE model trained with
# moe.balance = none, aux and bias (and a capacity factor, so that imbalance costs dropped tokens),
# and per balance mode the worst layer's load imbalance (max load / mean load - 1) and the drop
# fraction at a few steps, side by side. Prints one table.
# Usage: scripts/moe_balance.sh [steps] [capacity] [extra key=value ...]   (default 200 1.25)
set -euo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
steps=${1:-200} capacity=${2:-1.25}
shift $(( $# > 2 ? 2 : $# ))
mt="${MT_BUILD_DIR:-$root/build}/minitrain"
data="$root/data_cache/fortunes"
[[ -f "$data/meta.json" ]] || { echo "moe_balance.sh: run scripts/train.sh once first (prepares $data)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for mode in none aux bias; do
  "$mt" train model=tiny-moe model.vocab_size=2048 model.n_layer=4 moe.experts=8 moe.top_k=2 moe.every=2 \
    moe.capacity="$capacity" moe.balance="$mode" batch_size=8 seq_len=128 steps="$steps" optim.lr=2e-3 \
    optim.warmup_steps=20 data.path="$data" data.mode=shuffled out_dir="$work/$mode" log_every=100000 "$@" \
    2>/dev/null
done
/usr/bin/python3 - "$work" "$steps" <<'PY'
import json, sys
work, steps = sys.argv[1], int(sys.argv[2])
modes = ["none", "aux", "bias"]
runs = {m: [json.loads(l) for l in open(f"{work}/{m}/metrics.jsonl") if '"loss"' in l] for m in modes}
marks = sorted({1, steps // 10, steps // 4, steps // 2, steps})
print("| step | " + " | ".join(f"{m}: imbalance / drop / loss" for m in modes) + " |")
print("|---|" + "---|" * len(modes))
for s in marks:
    cells = []
    for m in modes:
        r = runs[m][s - 1]
        cells.append(f"{r['moe']['imbalance']:.2f} / {100 * r['moe']['drop_fraction']:.1f}% / {r['loss']:.3f}")
    print(f"| {s} | " + " | ".join(cells) + " |")
PY
