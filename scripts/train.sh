#!/usr/bin/env bash
# The main job: installs what is missing, builds, prepares the default corpus (the public-domain
# `fortunes` collection from Debian: ~15k short documents) on first run, trains a small GPT on it on
# the CPU backend, and prints a sample. Extra arguments are passed to `minitrain train` as overrides
# (e.g. `scripts/train.sh steps=50 precision=bf16`).
# Outputs: runs/fortunes/{metrics.jsonl,config.json,checkpoints/,model.safetensors,sample.txt,*.png}
# Environment: MT_QUICK=1 runs the same job at toy length (20 steps, as the README's test does);
# MT_WORK_DIR puts data_cache/ and runs/ there instead of the repository root; MT_BUILD_DIR names
# the build directory (default build/).
set -euo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
"$root/scripts/deps.sh"
"$root/scripts/build.sh"
mt="${MT_BUILD_DIR:-$root/build}/minitrain"

corpus_dir=/usr/share/games/fortunes
work=${MT_WORK_DIR:-$root}
data_dir="$work/data_cache/fortunes"
run_dir="$work/runs/fortunes"
quick=()
[[ "${MT_QUICK:-0}" == 1 ]] && quick=(steps=20 eval_every=10 log_every=5)
# The plain-text fortune files (not the .dat indexes or the .u8 links to the same texts).
mapfile -t inputs < <(find "$corpus_dir" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
[[ ${#inputs[@]} -gt 0 ]] || { echo "train.sh: no fortune files in $corpus_dir" >&2; exit 1; }
"$mt" data prepare --input "${inputs[@]}" --out "$data_dir" --splitter fortune --vocab 2048

# A fresh run each time: keep the previous one under runs/fortunes.prev.
if [[ -e "$run_dir" ]]; then rm -rf "$run_dir.prev"; mv "$run_dir" "$run_dir.prev"; fi
"$mt" train model=tiny model.vocab_size=2048 model.block_size=128 model.n_layer=4 model.n_embd=128 \
  model.n_head=4 batch_size=8 seq_len=128 steps=200 optim.lr=2e-3 optim.warmup_steps=20 \
  data.path="$data_dir" data.mode=shuffled eval_every=50 eval_batches=4 log_every=10 \
  out_dir="$run_dir" ${quick[@]+"${quick[@]}"} "$@"

"$mt" sample --model "$run_dir/model.safetensors" --tokenizer "$data_dir/tokenizer.json" \
  --text "The meaning of life" --tokens 80 --temperature 0.8 --top_k 40 --seed 1 | tee "$run_dir/sample.txt"
# The run's plots (loss, throughput, memory, noise scale), named as they are written.
echo "train.sh: plots of the run:"
/usr/bin/python3 "$root/scripts/plot.py" "$run_dir"
echo "train.sh: logs in $run_dir/metrics.jsonl, weights in $run_dir/model.safetensors, sample in $run_dir/sample.txt;" \
  "the summary of the run is the table the train command printed above"
