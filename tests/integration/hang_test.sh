#!/usr/bin/env bash
# A hung rank and a straggler in a 2-rank tiny run (train/stragglers.h, parallel/comm.h WaitPolicy):
#   hang       rank 1 stops itself (SIGSTOP) before step 3 with dist.timeout=2: the job must end with
#              exit status 4 within a few seconds of the timeout, rank 0 printing one "hung:" line
#              naming the group, the op and its sequence number, and leaving its flight records.
#   straggler  rank 1 sleeps 100 ms before every step from step 2: metrics.jsonl names it in the steps
#              after, and the end summary lists it first among the slowest ranks.
# Usage: hang_test.sh <minitrain>
set -u
mt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi=(timeout -k 5 60 mpirun --oversubscribe --mca btl self,vader --mca pml ob1 -np 2)
common=(model=tiny model.vocab_size=64 model.n_layer=1 model.n_embd=32 model.n_head=4 model.block_size=16 seq_len=16
        batch_size=2 steps=6 data.path=synthetic threads=1 ckpt.fault_rank=1)
fail=0
check() {  # <condition text> <0|1>
  if [[ $2 -eq 1 ]]; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi
}

start=$(date +%s.%N)
"${mpi[@]}" "$mt" train "${common[@]}" out_dir="$work/hang" dist.timeout=2 ckpt.fault_phase=hang ckpt.fault_step=3 \
  >"$work/hang.log" 2>&1
rc=$?
elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
echo "--- hang: exit status $rc after ${elapsed}s"
grep -aE 'hung|fault|error' "$work/hang.log"
check "exit status 4 (hung)" "$([[ $rc -eq 4 ]] && echo 1 || echo 0)"
# Startup, two steps, the 2 s timeout and the grace period (at most the timeout): well under 20 s.
check "ended within 20 s" "$(awk -v e="$elapsed" 'BEGIN { print (e < 20) ? 1 : 0 }')"
check "the fault fired" "$(grep -ac '^\[fault\] rank 1: SIGSTOP at step 3$' "$work/hang.log")"
check "one line from the live rank naming group, op and sequence number" \
  "$(grep -acE "^minitrain: \[rank 0\] error: hung: [a-z_]+ #[0-9]+( (to|from) rank 1)* on group '[a-z_]+' \(rank 0 of 2 there\) waited 2\.[0-9] s for its peers \(dist.timeout=2\); last communication records in .*/flight_recorder.rank0.jsonl$" "$work/hang.log")"
check "no other error line" "$([[ $(grep -ac 'error:' "$work/hang.log") -eq 1 ]] && echo 1 || echo 0)"
check "the flight records hold the op that timed out" \
  "$(/usr/bin/python3 - "$work/hang/flight_recorder.rank0.jsonl" <<'PY'
import json, sys
try:
    recs = [json.loads(l) for l in open(sys.argv[1])]
except OSError:
    print(0); sys.exit()
out = [r for r in recs if r["state"] == "timed_out"]
print(int(len(out) == 1 and all(k in out[0] for k in ("group", "seq", "op", "bytes", "issued"))
          and any(r["state"] == "completed" for r in recs)))
PY
)"

"${mpi[@]}" "$mt" train "${common[@]}" out_dir="$work/slow" log_every=1 ckpt.fault_phase=straggler ckpt.fault_step=2 \
  >"$work/slow.log" 2>&1
rc=$?
echo "--- straggler: exit status $rc"
grep -aE 'straggler|slowest' "$work/slow.log"
check "the straggler run completes" "$([[ $rc -eq 0 ]] && echo 1 || echo 0)"
check "metrics.jsonl names rank 1 in at least 4 of steps 2-6" "$(/usr/bin/python3 - "$work/slow/metrics.jsonl" <<'PY'
import json, sys
named = [j["step"] for j in map(json.loads, open(sys.argv[1]))
         if j.get("step", 0) >= 2 and "loss" in j and j.get("straggler", {}).get("rank") == 1
         and j["straggler"]["ratio"] > 1.5]
print(int(len(named) >= 4))
PY
)"
check "the progress line names it" "$([[ $(grep -ac '| straggler rank 1 x' "$work/slow.log") -ge 4 ]] && echo 1 || echo 0)"
check "the summary lists it first among the slowest ranks" \
  "$(grep -acE '^  slowest ranks +rank 1 x[0-9.]+ \(named in [4-6] of 6 steps\), rank 0 x' "$work/slow.log")"
exit $fail
