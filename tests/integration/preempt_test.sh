#!/usr/bin/env bash
# Preemption and the launcher's death, on 2-rank tiny runs (runtime/preempt.h):
#   fault:     rank 1 sends itself SIGTERM in step 3 (ckpt.fault_phase=preempt): the ranks agree at the
#              step boundary, save step 3 (not a save_every step) and exit 5 (mpirun's status too),
#              with one "preempted" line and event, no exported weights; resume=auto then finishes
#              bitwise equal to the uninterrupted run (final parameters, moments, every step's loss).
#   usr1:      SIGUSR1 to mpirun (forwarded to every rank) of a run far from its end: exit 5 within
#              seconds, the step reached saved; its resume with fewer steps says what changed.
#   deadline:  rank 1 stopped (SIGSTOP), SIGTERM to rank 0, preempt.deadline=1: rank 0 cannot reach a
#              boundary (rank 1 never joins the agreement) and ends within the deadline, not never.
#   second:    the same without a deadline: a second SIGTERM ends rank 0 at once.
#   orphans:   mpirun SIGKILLed mid-run: its ranks end at once (no orphan trains on).
# Usage: preempt_test.sh <minitrain>
set -u
mt=$1
work=$(mktemp -d)
pids_to_clean=()
cleanup() {
  local p
  for p in "${pids_to_clean[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi=(mpirun --oversubscribe --mca btl self,vader --mca pml ob1 -np 2)
failures=0
check() {  # check <description> <command...>
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}
for i in $(seq 1 200); do printf 'preempt %d saves %d steps.\n%%\n' "$i" $((i % 7)); done >"$work/corpus.txt"
"$mt" data prepare --input "$work/corpus.txt" --out "$work/data" --splitter fortune --vocab 300 >/dev/null 2>&1 \
  || { echo "FAIL data prepare"; exit 1; }
common=(model=tiny model.vocab_size=300 model.n_layer=1 model.n_embd=32 model.n_head=4 model.block_size=32 seq_len=32
        batch_size=2 save_every=4 data.path="$work/data" data.mode=shuffled threads=1 log_every=1000 peak_flops=1e9
        --zero 1)
# final_state and losses: how a run is compared with the uninterrupted one, as the fault tests do.
# shellcheck source=tests/integration/fault_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/fault_common.sh"
wait_for_step() {  # <metrics.jsonl> <step>: until a record of that step is written (at most 20 s)
  for _ in $(seq 1 400); do
    grep -q "\"step\":$2," "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
ranks_of() { pgrep -P "$1" -f "$mt" | tr '\n' ' '; }  # the minitrain children of a launcher
alive() { kill -0 "$1" 2>/dev/null && [[ $(ps -o stat= -p "$1" 2>/dev/null) != Z* ]]; }

# fault: the agreement, the save of a step that was not a save_every step, exit 5, bitwise resume
"${mpi[@]}" "$mt" train "${common[@]}" steps=6 out_dir="$work/ref" >/dev/null 2>&1 && final_state "$work/ref" \
  || { echo "FAIL reference run"; exit 1; }
"${mpi[@]}" "$mt" train "${common[@]}" steps=6 out_dir="$work/p" ckpt.fault_phase=preempt ckpt.fault_step=3 \
  ckpt.fault_rank=1 >"$work/p.log" 2>&1
check "fault: exit status 5 through mpirun (got $?)" test $? -eq 5
check "fault: rank 1 sent itself SIGTERM in step 3" grep -q "^\[fault\] rank 1: SIGTERM at step 3" "$work/p.log"
check "fault: one preempted line naming the saved step" test "$(grep -c "minitrain: preempted (SIGTERM): saved step 3 in .*exit status 5" "$work/p.log")" -eq 1
check "fault: no error line" bash -c '! grep -q "error:" "$1"' _ "$work/p.log"
check "fault: step 3 committed and verifies" "$mt" ckpt verify "$work/p/checkpoints/step_000003"
check "fault: latest is step 3" test "$(cat "$work/p/checkpoints/latest")" = step_000003
check "fault: the preempted event" grep -q '"event":"preempted".*"step":3' "$work/p/metrics.jsonl"
check "fault: no weights exported" test ! -e "$work/p/model.safetensors"
"${mpi[@]}" "$mt" train "${common[@]}" steps=6 out_dir="$work/p" ckpt.fault_phase=preempt ckpt.fault_step=3 \
  ckpt.fault_rank=1 resume=auto >"$work/p2.log" 2>&1
check "fault: the resume finishes" test $? -eq 0
check "fault: resumed at step 3" grep -q "resumed from .*step_000003 (step 3)" "$work/p2.log"
final_state "$work/p"
check "fault: bitwise equal to the uninterrupted run (parameters and moments)" cmp -s "$work/ref/final.safetensors" "$work/p/final.safetensors"
check "fault: every step's loss equal" diff <(losses "$work/ref/metrics.jsonl") <(losses "$work/p/metrics.jsonl")

# usr1: forwarded by mpirun, the step reached saved; the resume names what changed
"${mpi[@]}" "$mt" train "${common[@]}" steps=100000 out_dir="$work/u" >"$work/u.log" 2>&1 &
job=$!
pids_to_clean+=("$job")
wait_for_step "$work/u/metrics.jsonl" 2
t0=$(date +%s.%N)
kill -USR1 "$job"
wait "$job"
rc=$?
took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
check "usr1: exit 5 (got $rc) within 10 s ($took s)" awk -v r="$rc" -v t="$took" 'BEGIN { exit !(r == 5 && t < 10) }'
saved=$(sed -n 's/.*preempted (SIGUSR1): saved step \([0-9]*\) .*/\1/p' "$work/u.log")
check "usr1: the step reached ($saved) saved and latest" test "$(cat "$work/u/checkpoints/latest" 2>/dev/null)" = "$(printf 'step_%06d' "${saved:-0}")"
"$mt" train "${common[@]}" steps=$((saved + 1)) optim.lr=0.002 out_dir="$work/u" resume=auto >"$work/u2.log" 2>&1
check "usr1: a one-rank resume finishes" test $? -eq 0
check "usr1: the resume says what changed" grep -q "changed since step $saved (.*): .*optim.lr 0.0006 -> 0.002, .*steps 100000 -> $((saved + 1))" "$work/u2.log"

# deadline and second: rank 1 stopped, so rank 0 never reaches an agreed boundary
for mode in deadline second; do
  extra=()
  [[ $mode == deadline ]] && extra=(preempt.deadline=1) || extra=(preempt.deadline=0)
  "${mpi[@]}" "$mt" train "${common[@]}" steps=100000 out_dir="$work/$mode" "${extra[@]}" >"$work/$mode.log" 2>&1 &
  job=$!
  pids_to_clean+=("$job")
  wait_for_step "$work/$mode/metrics.jsonl" 2
  read -r r0 r1 < <(pgrep -P "$job" -f "$mt" | sort -n | tr '\n' ' ')
  pids_to_clean+=("$r0" "$r1")
  kill -STOP "$r1"
  kill -TERM "$r0"
  if [[ $mode == second ]]; then
    sleep 0.5
    check "second: one SIGTERM does not end a rank waiting for a boundary" alive "$r0"
    kill -TERM "$r0"
  fi
  gone=0
  for _ in $(seq 1 60); do alive "$r0" || { gone=1; break; }; sleep 0.05; done
  check "$mode: rank 0 ended within 3 s" test $gone -eq 1
  kill -KILL "$r1" "$job" 2>/dev/null
  wait "$job" 2>/dev/null
done

# orphans: the launcher killed, its ranks end at once
"${mpi[@]}" "$mt" train "${common[@]}" steps=100000 out_dir="$work/o" >"$work/o.log" 2>&1 &
job=$!
pids_to_clean+=("$job")
wait_for_step "$work/o/metrics.jsonl" 2
ranks=$(ranks_of "$job")
for r in $ranks; do pids_to_clean+=("$r"); done
kill -KILL "$job"
wait "$job" 2>/dev/null
gone=0
for _ in $(seq 1 40); do
  left=0
  for r in $ranks; do alive "$r" && left=1; done
  [[ $left -eq 0 ]] && { gone=1; break; }
  sleep 0.05
done
check "orphans: both ranks ($ranks) ended within 2 s of mpirun's death" test $gone -eq 1

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed; logs:"
  tail -n 5 "$work"/*.log
  exit 1
fi
echo "all preemption checks passed"
