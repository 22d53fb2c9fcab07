#!/usr/bin/env bash
# Activation memory per transformer layer under tensor and sequence parallelism, measured by the
# arena, next to Korthikanti et al. 2022 (Table 2). Each figure is the difference of the peak
# activation memory of `minitrain bench` with 2 layers and with 1 layer (so only what a layer keeps
# until backward counts), GPT-2 width (C = 768, 12 heads), bf16, materialized attention.
# Usage: scripts/tp_memory.sh [minitrain] [T] [B]     (runs up to 4 ranks under mpirun)
set -euo pipefail
mt=${1:-build/minitrain}
T=${2:-512}
B=${3:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --oversubscribe --mca btl self,vader --mca pml ob1)
C=768 A=12
act_mib() {  # <tp> <sp> <recompute> <layers> -> peak activation MiB of rank 0
  local tp=$1 sp=$2 rc=$3 L=$4 extra=()
  [[ $tp -gt 1 ]] && extra=(--tp "$tp" tp.sp="$sp")
  "${mpi[@]}" -np "$tp" "$mt" bench model=gpt2 model.n_layer="$L" precision=bf16 attention=materialized \
      recompute="$rc" batch_size="$B" seq_len="$T" steps=1 warmup=0 threads=1 "${extra[@]}" 2>/dev/null |
    awk -F'|' '/peak mem activations/ {gsub(/ /, "", $3); print $3}' |
    awk '/MiB/ {sub("MiB", ""); print $1} /KiB/ {sub("KiB", ""); print $1 / 1024} /GiB/ {sub("GiB", ""); print $1 * 1024}'
}
# Korthikanti et al. 2022, Table 2, bytes per layer at 16 bits (s b h units; t = tp).
formula() {  # <tp> <sp> <recompute>
  /usr/bin/python3 -c "
import sys
t, sp, rc = int(sys.argv[1]), sys.argv[2] == 'true', sys.argv[3]
s, b, h, a = $T, $B, $C, $A
att = 0 if rc == 'selective' else 5 * a * s / h
if t == 1: v = 34 + att
elif sp: v = (34 + att) / t
else: v = 10 + 24 / t + att / t
print('%.2f' % (s * b * h * v / 2**20))" "$@"
}
echo "| tp | sp | recompute | measured MiB/layer | Korthikanti Table 2 MiB/layer | ratio |"
echo "|---|---|---|---|---|---|"
for tp in 1 2 4; do
  for sp in true false; do
    [[ $tp -eq 1 && $sp == true ]] && continue
    for rc in none selective; do
      a1=$(act_mib "$tp" "$sp" "$rc" 1)
      a2=$(act_mib "$tp" "$sp" "$rc" 2)
      m=$(/usr/bin/python3 -c "print('%.2f' % ($a2 - $a1))")
      f=$(formula "$tp" "$sp" "$rc")
      r=$(/usr/bin/python3 -c "print('%.2f' % ($m / $f))")
      echo "| $tp | $([[ $tp -eq 1 ]] && echo - || echo $sp) | $rc | $m | $f | $r |"
    done
  done
done
