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
#   refused:   exits 2 (refused before the first step): not relaunched, exit 2 after one attempt;
#   identity:  a new run (no resume) dies before its first save in a directory holding another run's
#              checkpoints: relaunched with resume=own and the same run_id, and the other run's
#              checkpoints (and new ones it commits meanwhile) never count as progress;
#   stop:      SIGTERM to supervise passes SIGUSR1 (--stop-signal) to the command, waits for it and
#              exits with its status (5), relaunching nothing; also when it comes as supervise starts;
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
rid=""
for a in "$@"; do [[ $a == run_id=* ]] && rid=${a#run_id=}; done
commit() {  # commit <step> <run id>: a checkpoint as minitrain commits it (manifest metadata, latest)
  local d=$state/ckpt/$(printf 'step_%06d' "$1")
  mkdir -p "$d"
  echo "{\"meta\": {\"step\": $1, \"run_id\": \"$2\"}}" >"$d/manifest.json"
  printf 'step_%06d\n' "$1" >"$state/ckpt/latest"
}
start=0
if [[ "$*" == *resume=auto* && -f $state/ckpt/latest ]]; then start=$((10#$(sed 's/step_//' "$state/ckpt/latest"))); fi
if [[ $mode == stuck ]]; then exit 1; fi
if [[ $mode == diverged ]]; then exit 3; fi
if [[ $mode == refused ]]; then exit 2; fi
if [[ $mode == identity ]]; then commit $((20 + n)) other; exit 1; fi  # another run commits; this one dies
if [[ $mode == stop ]]; then
  trap 'echo usr1 >>"$state/signals"; commit 7 "$rid"; exit 5' USR1
  trap 'echo term >>"$state/signals"; exit 143' TERM
  touch "$state/started"
  for i in $(seq 1 100); do sleep 0.1; done
  exit 0
fi
echo "{\"event\": \"start\", \"run_id\": \"$rid\"}" >>"$state/metrics.jsonl"
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
  if [[ $i -eq 2 ]]; then commit $s "$rid"; fi
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
rid=$(sed -n 's/.* run_id=\([0-9a-f]*\)$/\1/p' "$s/args.log" | head -1)
check "recovers: a run id drawn ($rid)" test ${#rid} -eq 16
check "recovers: first attempt as given, with the run id" test "$(sed -n 1p "$s/args.log")" = "$s recovers resume=none run_id=$rid"
check "recovers: restarts resume=auto (a continued run), same run id" test "$(sed -n 3p "$s/args.log")" = "$s recovers run_id=$rid resume=auto"
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

# refused: never relaunched, its status passed on
s=$work/refused
mkdir -p "$s"
"$supervise" --max-restarts 5 --ckpt-dir "$s/ckpt" -- "$work/fake_train" "$s" refused 2>"$s/stderr"
rc=$?
check "refused: exit 2" test $rc -eq 2
check "refused: not relaunched" test "$(cat "$s/count")" -eq 1
check "refused: says why" grep -q "the command was refused (exit status 2" "$s/stderr"

# identity: another run's checkpoints (one there before, one more per attempt) are not progress, and
# the relaunches of a new run resume only its own checkpoints
s=$work/identity
mkdir -p "$s/ckpt/step_000020"
echo '{"meta": {"step": 20, "run_id": "other"}}' >"$s/ckpt/step_000020/manifest.json"
"$supervise" --max-restarts 5 --ckpt-dir "$s/ckpt" -- "$work/fake_train" "$s" identity run_id=mine 2>"$s/stderr"
rc=$?
check "identity: exit 3 (no progress of its own)" test $rc -eq 3
check "identity: the given run id kept, no other drawn" test "$(sed -n 1p "$s/args.log")" = "$s identity run_id=mine"
check "identity: relaunched with resume=own" test "$(sed -n 2p "$s/args.log")" = "$s identity run_id=mine resume=own"
check "identity: another run's checkpoints are no progress" grep -q "no progress (step none yet)" "$s/stderr"
check "identity: never progress" bash -c '! grep -q "progress: step" "$1"' _ "$s/stderr"

# stop: SIGTERM to supervise reaches the command as SIGUSR1; its status is supervise's
s=$work/stop
mkdir -p "$s"
"$supervise" --max-restarts 5 --ckpt-dir "$s/ckpt" -- "$work/fake_train" "$s" stop 2>"$s/stderr" &
sup=$!
for i in $(seq 1 100); do [[ -f $s/started ]] && break; sleep 0.05; done
kill -TERM $sup
wait $sup
rc=$?
check "stop: exit 5 (the command's)" test $rc -eq 5
check "stop: the command got SIGUSR1 once" test "$(cat "$s/signals" 2>/dev/null)" = "usr1"
check "stop: not relaunched" test "$(cat "$s/count")" -eq 1
check "stop: says so" grep -q "stopping: SIGTERM received; the command exited with status 5" "$s/stderr"
s=$work/stopterm
mkdir -p "$s"
# A command started with & in a script ignores SIGINT (and a shell cannot trap a signal ignored at its
# start): supervise is started with SIGINT's default action restored, as a terminal would start it.
/usr/bin/python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
  "$supervise" --stop-signal TERM -- "$work/fake_train" "$s" stop 2>"$s/stderr" &
sup=$!
for i in $(seq 1 100); do [[ -f $s/started ]] && break; sleep 0.05; done
kill -INT $sup
wait $sup
check "stop: --stop-signal TERM passes SIGTERM (on SIGINT)" test "$(cat "$s/signals" 2>/dev/null)" = "term"

# stop early: SIGTERM within the first moments of supervise (before, while and just after it starts
# the command) never leaves the command running unstopped: each trial ends within 3 s.
s=$work/stopearly
unstopped=0
for d in 0 0.01 0.02 0.03 0.04 0.05 0.06 0.08 0.1 0.12 0.15 0.2; do
  rm -rf "$s" && mkdir -p "$s"
  "$supervise" --ckpt-dir "$s/ckpt" -- "$work/fake_train" "$s" stop 2>"$s/stderr" &
  sup=$!
  sleep "$d"
  kill -TERM $sup 2>/dev/null
  for i in $(seq 1 60); do kill -0 $sup 2>/dev/null || break; sleep 0.05; done
  if kill -0 $sup 2>/dev/null; then
    unstopped=$((unstopped + 1))
    echo "  stop early: SIGTERM after $d s left the command running"
    pkill -KILL -f "$work/fake_train $s stop" 2>/dev/null
    kill -KILL $sup 2>/dev/null
  fi
  wait $sup 2>/dev/null
done
check "stop early: a SIGTERM at any moment of the start stops the command" test $unstopped -eq 0

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
check "usage: --help lists the exit statuses" grep -q "never relaunched" <<<"$help"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed; supervise output of the last case:"
  cat "$s/stderr"
  exit 1
fi
echo "all supervise checks passed"
