#!/usr/bin/env bash
# trace=1 end to end: a pp2 x dp2 run under mpirun writes one Chrome trace per rank holding exactly the
# traced steps, each rank's pipeline actions (F and B of every micro-batch), its point-to-point and
# gradient traffic with byte counts, and ops, every span inside its step; `bench trace=1` writes one
# too; a bad trace option fails in one line before anything is written.
# Usage: trace_test.sh <minitrain>
set -u
mt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fails=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
tiny=(data.path=synthetic model.vocab_size=128 model.n_layer=2 model.n_embd=32 model.n_head=4 seq_len=16
      batch_size=2 threads=1 log_every=100)

"$mt" train "${tiny[@]}" steps=3 trace=1 trace.steps=0 out_dir="$work/bad" 2>"$work/bad.log"
check "trace.steps=0 refused in one line naming it" "[[ \$? -ne 0 ]] && grep -q 'trace.steps' '$work/bad.log' && [[ \$(wc -l <'$work/bad.log') -eq 1 && ! -e '$work/bad' ]]"

"$mt" bench "${tiny[@]}" steps=2 trace=1 out_dir="$work/bench" >"$work/bench.log" 2>&1
check "bench trace=1 writes rank 0's trace" "[[ -s '$work/bench/trace/rank_00000.json' ]]"

if [[ "$("$mt" --version)" != *"MPI on"* ]]; then
  echo "skip the pp2 x dp2 trace (this build has no MPI)"
  exit $((fails > 0))
fi
mpirun --oversubscribe --mca btl self,vader --mca pml ob1 -np 4 "$mt" train "${tiny[@]}" --pp 2 grad_accum=4 steps=5 \
  trace=1 trace.start=2 trace.steps=2 out_dir="$work/pp" 2>"$work/pp.log" || { echo "FAIL pp2 x dp2 run"; tail -5 "$work/pp.log"; exit 1; }
check "the run names the trace files" "grep -q 'trace of steps 2 to 3 in $work/pp/trace/rank_\*.json' '$work/pp.log'"
/usr/bin/python3 - "$work/pp/trace" <<'PY' || fails=$((fails + 1))
import json, sys, collections
bad = []
for r in range(4):
    doc = json.load(open(f"{sys.argv[1]}/rank_{r:05d}.json"))
    ev = doc["traceEvents"]
    lanes = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    proc = [e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"]
    spans = [dict(e, lane=lanes[e["tid"]]) for e in ev if e["ph"] == "X"]
    by = collections.defaultdict(list)
    for s in spans: by[s["lane"]].append(s)
    steps = sorted(s["name"] for s in by["step"])
    if not proc or not proc[0].startswith(f"rank {r} "): bad.append(f"rank {r}: process name {proc}")
    if steps != ["step 2", "step 3"]: bad.append(f"rank {r}: step spans {steps}")
    pipe = collections.Counter(s["name"] for s in by["pipeline"])
    want = collections.Counter({f"{k}{m}": 2 for k in "FB" for m in range(4)})
    if pipe != want: bad.append(f"rank {r}: pipeline spans {dict(pipe)}")
    p2p = [s for s in by["comm pp"] if s["name"] in ("send", "recv", "send_recv")]
    if len(p2p) < 8 or any(s["args"]["bytes"] <= 0 for s in p2p): bad.append(f"rank {r}: {len(p2p)} pp messages")
    if not any(s["name"] == "all_reduce" for s in by["comm dp"]): bad.append(f"rank {r}: no dp all_reduce")
    if not any(s["name"] == "matmul_fwd" for s in by["ops"]): bad.append(f"rank {r}: no matmul_fwd op")
    windows = [(s["ts"], s["ts"] + s["dur"]) for s in by["step"]]
    for s in spans:
        if s["lane"] != "step" and not any(a - 1 <= s["ts"] and s["ts"] + s["dur"] <= b + 1 for a, b in windows):
            bad.append(f"rank {r}: {s['lane']} span {s['name']} outside the traced steps"); break
print("\n".join("FAIL " + b for b in bad) if bad else "ok   every rank's trace: steps 2-3, F/B of 4 micro-batches twice, pp and dp traffic, ops inside steps")
sys.exit(1 if bad else 0)
PY
exit $((fails > 0))
