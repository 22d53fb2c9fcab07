#!/usr/bin/env bash
# Kill-and-resume, proven bitwise. A 4-rank run (--np N: N ranks; ZeRO-1, async checkpoints every 2
# steps) is killed (SIGKILL) on a seeded random rank at a phase: forward, backward, optimizer, checkpoint staging,
# checkpoint write, before commit, after commit — or its checkpoint write fails with ENOSPC. The
# supervisor relaunches it with resume=auto. The final parameters and AdamW moments (exported from
# the last checkpoint) and the loss of every step must equal the uninterrupted run's, bit for bit.
# Usage: fault_test.sh <minitrain> <supervise> [trials|phases] [seed] [--np N] [layout flags...]
#   trials 0 (or none): every phase once; a number: that many kills at random phases and steps; a
#   comma-separated list of phases (e.g. forward,write,enospc): those phases once each.
#   --np N: ranks (default 4). Layout flags (e.g. --tp 2: tensor-parallel pairs, tp=2 x dp=2; or
#   --tp 2 --cp 2 --pp 2 with --np 8) are added to every run.
set -u
mt=$1
supervise=$2
trials=${3:-0}
seed=${4:-$RANDOM}
layout=("${@:5}")
np=4
if [[ ${layout[0]:-} == --np ]]; then
  np=${layout[1]}
  layout=("${layout[@]:2}")
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi=(mpirun --oversubscribe --mca btl self,vader --mca pml ob1 -np "$np")
echo "fault_test: seed $seed, $np ranks, layout: --zero 1 ${layout[*]}"

# shellcheck source=tests/integration/fault_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/fault_common.sh"
fault_setup "${layout[@]}"

phases=(forward backward optimizer staging write before_commit after_commit enospc)
# A uniform pick in [0, n) from bash's RANDOM using its high bits (its low bits repeat quickly), into
# $picked: called in the shell itself, since bash reseeds RANDOM in every subshell ($(...) would not
# follow the seed).
pick() { picked=$(( RANDOM * $1 / 32768 )); }
plan=()
if [[ $trials == *[a-z]* ]]; then
  IFS=, read -r -a plan <<<"$trials"
  for p in "${plan[@]}"; do
    [[ " ${phases[*]} " == *" $p "* ]] || { echo "fault_test: unknown phase '$p' (phases: ${phases[*]})"; exit 2; }
  done
elif [[ $trials -eq 0 ]]; then
  for p in "${phases[@]}"; do plan+=("$p"); done
else
  RANDOM=$seed
  for _ in $(seq 1 "$trials"); do pick ${#phases[@]}; plan+=("${phases[$picked]}"); done
fi
"${mpi[@]}" "$mt" train "${common[@]}" out_dir="$work/ref" 2>/dev/null || { echo "FAIL reference run"; exit 1; }
final_state "$work/ref" || { echo "FAIL export reference"; exit 1; }

RANDOM=$seed
ok=0
n=0
for phase in "${plan[@]}"; do
  n=$((n + 1))
  pick "$np"
  rank=$picked
  case $phase in  # checkpoint phases happen in the saves after steps 2, 4, 6; compute phases in steps 1-8
    staging|write|before_commit|after_commit|enospc) pick 3; step=$((2 * (1 + picked))) ;;
    *) pick 8; step=$((1 + picked)) ;;
  esac
  out="$work/run$n"
  "$supervise" --max-restarts 3 --ckpt-dir "$out/checkpoints" --metrics "$out/metrics.jsonl" --log "$out.supervise.log" -- \
    "${mpi[@]}" "$mt" train "${common[@]}" out_dir="$out" \
    ckpt.fault_phase="$phase" ckpt.fault_step="$step" ckpt.fault_rank="$rank" >"$out.log" 2>&1
  rc=$?
  restarts=$(grep -c 'restart' "$out.supervise.log" 2>/dev/null || true)
  # The fault fired (a kill says so on stderr; ENOSPC fails the save): a trial without it proves nothing.
  fired=0
  grep -q -e '^\[fault\] rank' -e 'No space left on device' "$out.log" && fired=1
  if [[ $rc -eq 0 && $fired -eq 1 ]] && final_state "$out" >/dev/null 2>&1 && cmp -s "$work/ref/final.safetensors" "$out/final.safetensors" \
     && diff <(losses "$work/ref/metrics.jsonl") <(losses "$out/metrics.jsonl") >/dev/null; then
    ok=$((ok + 1))
    echo "ok   $phase at step $step on rank $rank: identical (supervisor log lines mentioning restarts: $restarts)"
  else
    echo "FAIL $phase at step $step on rank $rank (rc=$rc, fault fired: $fired); last lines:"
    tail -5 "$out.log"
  fi
done
echo "$ok/$n identical"
[[ $ok -eq $n ]]
