#!/usr/bin/env bash
# Refusals (exit status 2, runtime/exit_status.h) that leave nothing behind, and the run's identity:
#   options:   a bad option value: exit 2, one error line; under mpirun (2 ranks) too.
#   memory:    batch_size=16000000 and moe.experts=65536: refused within seconds with one line citing
#              the plan's peak per rank and mem.check=off, before out_dir exists.
#   lock:      out_dir held by another process's flock: exit 2, nothing written into it; a new out_dir
#              whose ckpt.dir is held: exit 2 and the new out_dir is gone again (no run.lock left).
#   identity:  a new run (run_id=b1, resume=fresh) killed before its first save, in a directory holding
#              run a1's checkpoints, relaunched with resume=own: starts at step 0 and never resumes a1;
#              its checkpoints and lock name b1; resume=auto then resumes b1's own newest checkpoint.
# Usage: refuse_test.sh <minitrain>
set -u
mt=$1
work=$(mktemp -d)
holder=""
cleanup() {
  [[ -n $holder ]] && kill "$holder" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
failures=0
check() {  # check <description> <command...>
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}
errors() { grep -c "error:" "$1"; }
tiny=(model=tiny model.vocab_size=64 model.n_layer=1 model.n_embd=32 model.n_head=4 model.block_size=32 seq_len=32
      batch_size=2 data.path=synthetic threads=1 log_every=1000 peak_flops=1e9)

# options
"$mt" train "${tiny[@]}" optim.lr=fast out_dir="$work/bad" >"$work/bad.log" 2>&1
check "options: exit 2 (got $?)" test $? -eq 2
check "options: one error line" test "$(errors "$work/bad.log")" -eq 1
check "options: nothing written" test ! -e "$work/bad"
mpirun --oversubscribe --mca btl self,vader --mca pml ob1 -np 2 "$mt" train "${tiny[@]}" steps=0 out_dir="$work/bad2" \
  >"$work/bad2.log" 2>&1
check "options: exit 2 under mpirun (got $?)" test $? -eq 2

# memory
for big in "${tiny[*]} batch_size=16000000" "model=tiny-moe moe.experts=65536 data.path=synthetic"; do
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$mt" train $big out_dir="$work/big" >"$work/big.log" 2>&1
  rc=$?
  big=${big#"${tiny[*]} "}
  took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  check "memory ($big): exit 2 (got $rc) within 5 s ($took s)" awk -v r="$rc" -v t="$took" 'BEGIN { exit !(r == 2 && t < 5) }'
  check "memory ($big): one line citing the plan and the override" \
    test "$(grep -c "error: the planned peak memory per rank, .* exceeds the .* each rank can have (the host's MemAvailable.*mem.check=off" "$work/big.log")" -eq 1
  check "memory ($big): only that line" test "$(errors "$work/big.log")" -eq 1
  check "memory ($big): out_dir not created" test ! -e "$work/big"
done

# lock: another process holds out_dir, then ckpt.dir
mkdir -p "$work/held"
echo "pid 1 on host elsewhere, run zz" >"$work/held/run.lock"
# The holder takes the lock on an open descriptor and becomes `sleep` itself: killing it frees the lock.
bash -c 'exec 9>>"$1" && flock 9 && exec sleep 60' _ "$work/held/run.lock" >/dev/null 2>&1 &
holder=$!
for _ in $(seq 1 100); do flock -n "$work/held/run.lock" true 2>/dev/null || break; sleep 0.02; done
"$mt" train "${tiny[@]}" steps=2 out_dir="$work/held" resume=fresh >"$work/lock1.log" 2>&1
check "lock: held out_dir is exit 2 (got $?)" test $? -eq 2
check "lock: the message names the holder" grep -q "out_dir '$work/held' is in use by another run (pid 1 on host elsewhere, run zz)" "$work/lock1.log"
check "lock: nothing written into the held out_dir" test "$(ls "$work/held")" = run.lock
"$mt" train "${tiny[@]}" steps=2 out_dir="$work/new/run" ckpt.dir="$work/held" >"$work/lock2.log" 2>&1
check "lock: held ckpt.dir is exit 2 (got $?)" test $? -eq 2
check "lock: the new out_dir is removed again" test ! -e "$work/new"
kill "$holder"
wait "$holder" 2>/dev/null
holder=""

# identity
d=$work/id
"$mt" train "${tiny[@]}" steps=4 save_every=2 out_dir="$d" run_id=a1 >"$work/a1.log" 2>&1
check "identity: run a1 finishes" test $? -eq 0
("$mt" train "${tiny[@]}" steps=4 save_every=2 out_dir="$d" run_id=b1 resume=fresh ckpt.fault_phase=forward \
  ckpt.fault_step=1 >"$work/b1.log" 2>&1) 2>/dev/null
check "identity: run b1 killed before its first save" grep -q "SIGKILL at step 1" "$work/b1.log"
"$mt" train "${tiny[@]}" steps=4 save_every=2 out_dir="$d" run_id=b1 resume=own ckpt.fault_phase=forward \
  ckpt.fault_step=1 >"$work/b1r.log" 2>&1
check "identity: the relaunch finishes" test $? -eq 0
check "identity: the relaunch resumed nothing (a1's checkpoints are not b1's)" bash -c '! grep -q "resumed from" "$1"' _ "$work/b1r.log"
check "identity: it says a1's checkpoints were left alone" grep -q "belong to other runs than b1: not resumed" "$work/b1r.log"
check "identity: b1's final checkpoint carries its id" grep -q '"run_id": *"b1"' "$d/checkpoints/step_000004/manifest.json"
"$mt" train "${tiny[@]}" steps=6 save_every=2 out_dir="$d" run_id=b1 resume=auto >"$work/b1a.log" 2>&1
check "identity: resume=auto resumes b1's own newest" grep -q "resumed from .*step_000004 (step 4)" "$work/b1a.log"
check "identity: the lock names the run" grep -q ", run b1" "$d/run.lock"
"$mt" train "${tiny[@]}" steps=2 out_dir="$work/own" resume=own >"$work/own.log" 2>&1
check "identity: resume=own without run_id is refused (exit 2)" test $? -eq 2

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed; logs:"
  tail -n 4 "$work"/*.log
  exit 1
fi
echo "all refusal checks passed"
