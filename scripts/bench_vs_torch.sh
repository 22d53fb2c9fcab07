#!/usr/bin/env bash
# minitrain vs PyTorch eager on the same training config, measured in one run on this machine, both
# in fp32 with the same thread count. Prints both tables and a summary line with the ratio.
# Usage: scripts/bench_vs_torch.sh [preset] [B] [T] [steps] [warmup]   (default: gpt2 4 256 3 1)
set -euo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
preset=${1:-gpt2} B=${2:-4} T=${3:-256} steps=${4:-3} warmup=${5:-1}
threads=$(nproc)
"$root/scripts/deps.sh" --with-torch
"$root/scripts/build.sh"
mt="${MT_BUILD_DIR:-$root/build}/minitrain"
echo "== minitrain ($preset, B=$B, T=$T, fp32, $threads threads) =="
mt_out=$("$mt" bench model="$preset" batch_size="$B" seq_len="$T" steps="$steps" warmup="$warmup" threads="$threads" 2>/dev/null)
echo "$mt_out"
# PyTorch twice: as installed, and with OpenBLAS told the CPU type (Debian's OpenBLAS 0.3.21 does not
# recognise recent Xeons and falls back to generic kernels; SkylakeX gives it its AVX-512 kernels).
run_torch() {
  /usr/bin/python3 "$root/scripts/bench_torch.py" --preset "$preset" --batch "$B" --seq "$T" --steps "$steps" \
    --warmup "$warmup" --threads "$threads"
}
echo "== PyTorch eager (as installed) =="
pt_out=$(run_torch)
echo "$pt_out"
echo "== PyTorch eager (OPENBLAS_CORETYPE=SkylakeX) =="
pt2_out=$(OPENBLAS_CORETYPE=SkylakeX run_torch)
echo "$pt2_out"
mt_tps=$(echo "$mt_out" | awk -F'|' '/tokens\/s \(median\)/ {gsub(/ /, "", $3); print $3}')
pt_tps=$(echo "$pt_out" | awk -v p="$preset" '$1 == p {print $7; exit}')
pt2_tps=$(echo "$pt2_out" | awk -v p="$preset" '$1 == p {print $7; exit}')
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "?" }'; }
# Each side's share of the cores' FMA limit (bench's "MFU of FMA peak": the same FLOPs per token, so
# PyTorch's share is minitrain's scaled by the throughputs).
fma_mfu=$(echo "$mt_out" | awk -F'|' '/MFU of FMA peak/ {split($3, w, "%"); gsub(/ /, "", w[1]); print w[1]}')
share() { awk -v m="$fma_mfu" -v a="$1" -v b="$mt_tps" 'BEGIN { if (m > 0 && b > 0) printf "%.1f%%", m * a / b; else print "?" }'; }
echo "summary: $(date -u +%F) $preset B=$B T=$T fp32 threads=$threads: minitrain $mt_tps tok/s;" \
     "PyTorch eager $pt_tps tok/s (ratio $(ratio "$mt_tps" "$pt_tps")), with SkylakeX OpenBLAS $pt2_tps tok/s" \
     "(ratio $(ratio "$mt_tps" "$pt2_tps")); of the FMA peak: minitrain $(share "$mt_tps"), PyTorch" \
     "$(share "$pt_tps") / $(share "$pt2_tps")"
