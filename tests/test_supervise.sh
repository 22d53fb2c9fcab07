#!/usr/bin/env bash
# scripts/supervise against a fake training command whose failures and progress are scripted:
#   recovers:  fails twice (exit 1 one second after its checkpoint, then SIGKILL), then succeeds:
#              exit 0, relaunched with resume=auto (replacing resume=none), the time lost counted
#              from the checkpoint, goodput counting each step's last record once;
#   stuck:     always fails before any progress: exit 3 after 3 restarts without progress;
#   progress:  always fails, but after a new checkpoint each time: exit 4 once --max-restarts is used;
#   diverged:  exits 3 (training diverged): not relaunched, exit 3 after one attempt;
#   beside:    steps that ran beside a background checkpoint write ("ckpt_overlap_s") count in the
#              goodput, together, at most their number times the median step that ran alone; with
#              none alone, nothing is subtracted and the summary says so;
#   usage:     no command: exit 2; --help prints the description, exit 0.
# Usage: tests/test_supervise.sh [path/to/supervise]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
supervise=${1:-$root/scripts/supervise}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
check() {  # check <description> <command...>
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}

# The fake trainer: fake_train <state dir> <mode> [args...]. Each attempt n runs 4 steps starting
# after the checkpointed step, each taking "time.total" = n/10 s in metrics.jsonl, commits a
# checkpoint after its second step, then fails or succeeds as the mode says.
cat >"$work/fake_train" <<'FAKE'
#!/usr/bin/env bash
state=$1 mode=$2
n=$(( $(cat "$state/count" 2>/dev/null || echo 0) + 1 ))
echo $n >"$state/count"
echo "$*" >>"$state/args.log"
mkdir -p "$state/ckpt"
start=0
if [[ "$*" == *resume=auto* && -f $state/ckpt/latest ]]; then start=$((10#$(sed 's/step_//' "$state/ckpt/latest"))); fi
if [[ $mode == stuck ]]; then exit 1; fi
if [[ $mode == diverged ]]; then exit 3; fi
if [[ $mode == beside || $mode == allbeside ]]; then
  totals=(1.0 1.2 3.0 0.8 2.5 0.9)
  overlaps=(0 0 0.5 0 0.2 0.1)
  for i in 0 1 2 3 4 5; do
    o=${overlaps[$i]}
    [[ $mode == allbeside ]] && o=0.1
    extra=""
    [[ $o != 0 ]] && extra=", \"ckpt_overlap_s\": $o"
    echo "{\"step\": $((i + 1)), \"loss\": 1.0, \"time\": {\"total\": ${totals[$i]}}$extra}" >>"$state/metrics.jsonl"
  done
  exit 0
fi
for i in 1 2 3 4; do
  s=$((start + i))
  echo "{\"step\": $s, \"loss\": 1.0, \"time\": {\"data\": 0.0, \"total\": 0.$n}}" >>"$state/metrics.jsonl"
  if [[ $i -eq 2 ]]; then printf 'step_%06d\n' $s >"$state/ckpt/latest"; fi
done
echo '{"event": "end", "step": 99, "time": {"total": 100}}' >>"$state/metrics.jsonl"
if [[ $mode == progress ]]; then exit 1; fi
if [[ $n -eq 1 ]]; then sleep 1; exit 1; fi  # 1 s of work after the checkpoint is lost
if [[ $n -eq 2 ]]; then kill -9 $$; fi
exit 0
FAKE
chmod +x "$work/fake_train"

# recovers
s=$work/recovers
mkdir -p "$s"
"$supervise" --max-restarts 5 --log "$s/supervise.log" --ckpt-dir "$s/ckpt" --metrics "$s/metrics.jsonl" \
  -- "$work/fake_train" "$s" recovers resume=none 2>"$s/stderr"
rc=$?
check "recovers: exit 0" test $rc -eq 0
check "recovers: 3 attempts" test "$(cat "$s/count")" -eq 3
check "recovers: first attempt as given" test "$(sed -n 1p "$s/args.log")" = "$s recovers resume=none"
check "recovers: restarts resume=auto" test "$(sed -n 3p "$s/args.log")" = "$s recovers resume=auto"
check "recovers: exit status logged" grep -q "attempt 1 failed: exit status 1 " "$s/supervise.log"
check "recovers: signal named" grep -q "attempt 2 failed: exit status 137 (signal KILL)" "$s/supervise.log"
check "recovers: time lost logged" grep -q "time lost since the last checkpoint: [0-9.]* s; progress: step none yet -> 2" "$s/supervise.log"
lost=$(sed -n 's/.*attempt 1 failed: .*time lost since the last checkpoint: \([0-9.]*\) s.*/\1/p' "$s/supervise.log")
check "recovers: time lost counts from the checkpoint ($lost s)" awk -v l="$lost" 'BEGIN { exit !(l >= 0.9 && l < 5) }'

# Steps 1-2 survive from attempt 1 (0.1 s each), 3-4 from attempt 2 (0.2), 5-8 from attempt 3 (0.3).
check "recovers: goodput from the surviving steps" grep -q "useful step time 1.8 s over 8 unique steps" "$s/supervise.log"
check "recovers: summary" grep -q "summary: 3 attempt(s), 2 restart(s)" "$s/supervise.log"

# stuck: progress read from the metrics file (never written)
s=$work/stuck
mkdir -p "$s"
"$supervise" --metrics "$s/metrics.jsonl" -- "$work/fake_train" "$s" stuck 2>"$s/stderr"
rc=$?
check "stuck: exit 3" test $rc -eq 3
check "stuck: 1 attempt + 3 restarts" test "$(cat "$s/count")" -eq 4
check "stuck: says why" grep -q "3 restarts in a row made no progress" "$s/stderr"
check "stuck: goodput without steps" grep -q "goodput: n/a" "$s/stderr"

# progress: every attempt commits a new checkpoint, but the restarts run out
s=$work/progress
mkdir -p "$s"
"$supervise" --max-restarts 2 --ckpt-dir "$s/ckpt" -- "$work/fake_train" "$s" progress 2>"$s/stderr"
rc=$?
check "progress: exit 4" test $rc -eq 4
check "progress: 1 attempt + 2 restarts" test "$(cat "$s/count")" -eq 3
check "progress: says why" grep -q "used all 2 restart(s)" "$s/stderr"

# diverged: never relaunched
s=$work/diverged
mkdir -p "$s"
"$supervise" --max-restarts 5 --ckpt-dir "$s/ckpt" -- "$work/fake_train" "$s" diverged 2>"$s/stderr"
rc=$?
check "diverged: exit 3" test $rc -eq 3
check "diverged: not relaunched" test "$(cat "$s/count")" -eq 1
check "diverged: says why" grep -q "training diverged (exit status 3)" "$s/stderr"

# beside: alone 1.0 1.2 0.8 1.0 (median 1.0); beside 3.0 2.5 0.9 -> 2.0 + 1.5 - 0.1 = 3.4 s of
# slowdown, so of 9.4 s of step time 6.0 s are useful.
s=$work/beside
mkdir -p "$s"
"$supervise" --metrics "$s/metrics.jsonl" -- "$work/fake_train" "$s" beside 2>"$s/stderr"
check "beside: exit 0" test $? -eq 0
check "beside: the slowdown beside checkpoint writes is not useful time" grep -q \
  "useful step time 6.0 s over 6 unique steps, less 3.4 s of slowdown in 3 steps beside background checkpoint writes (steps alone: median 1.000 s)" "$s/stderr"
s=$work/allbeside
mkdir -p "$s"
"$supervise" --metrics "$s/metrics.jsonl" -- "$work/fake_train" "$s" allbeside 2>"$s/stderr"
check "beside: with no step alone, nothing subtracted, said" grep -q \
  "useful step time 9.4 s over 6 unique steps, 6 steps beside background checkpoint writes and none alone to compare" "$s/stderr"

"$supervise" --max-restarts 2 -- 2>/dev/null
check "usage: no command is exit 2" test $? -eq 2
"$supervise" --max-restarts x -- true 2>/dev/null
check "usage: bad --max-restarts is exit 2" test $? -eq 2
help=$("$supervise" --help 2>/dev/null)
check "usage: --help is exit 0" test $? -eq 0
check "usage: --help explains the restart loop" grep -q "resume=auto" <<<"$help"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed; supervise output of the last case:"
  cat "$s/stderr"
  exit 1
fi
echo "all supervise checks passed"
