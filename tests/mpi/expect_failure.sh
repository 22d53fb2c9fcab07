#!/usr/bin/env bash
# Runs a command that must FAIL promptly: passes when it exits non-zero before <seconds> (a hang
# is a failure of this test, not a pass) and its combined output has exactly <count> lines
# matching the extended regex <pattern> (an empty pattern skips that check); with --status N, its
# exit status must be N.
# Usage: expect_failure.sh <seconds> <pattern> <count> [--status N] -- command [args...]
set -u
limit=$1 pattern=$2 want=$3
shift 3
want_status=""
if [[ "${1:-}" == "--status" ]]; then want_status=$2; shift 2; fi
[[ "${1:-}" == "--" ]] && shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s.%N)
timeout -k 5 "$limit" "$@" >"$log" 2>&1
rc=$?
elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
cat "$log"
echo "--- exit status $rc after ${elapsed}s"
# timeout(1) exits 124 (or 137 after -k); mpirun itself also exits 137 when a rank was SIGKILLed,
# so the elapsed time decides.
if [[ $rc -eq 124 ]] || awk -v e="$elapsed" -v l="$limit" 'BEGIN { exit !(e >= l) }'; then
  echo "FAIL: the job did not end within ${limit}s (it hangs instead of failing)"
  exit 1
fi
if [[ $rc -eq 0 ]]; then
  echo "FAIL: the job exited 0 but a rank failed"
  exit 1
fi
if [[ -n "$want_status" && $rc -ne $want_status ]]; then
  echo "FAIL: exit status $rc, expected $want_status"
  exit 1
fi
if [[ -n "$pattern" ]]; then
  got=$(grep -cE -- "$pattern" "$log")
  if [[ "$got" -ne "$want" ]]; then
    echo "FAIL: $got lines match '$pattern', expected $want"
    exit 1
  fi
fi
echo "PASS: non-zero exit in ${elapsed}s"
