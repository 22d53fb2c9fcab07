#!/usr/bin/env bash
# `minitrain plan` as a user runs it: a pipeline report on stdout with exit status 0, and bad input
# refused with exit status 1 and one `minitrain: error:` line naming the option.
# Usage: plan_test.sh <minitrain binary>
set -u
mt=$1
fails=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

out=$("$mt" plan pp=4 grad_accum=8 pp.schedule=1f1b 2>&1)
rc=$?
if [[ $rc -eq 0 && "$out" == *"bubble of the step:  simulated 0.2727  formula (p-1)/(m+p-1) = 0.2727"* ]]; then
  pass "plan prints the 1f1b bubble next to its formula"
else
  fail "plan prints the 1f1b bubble next to its formula (rc=$rc: $out)"
fi

bad() {
  local what=$1 needle=$2
  shift 2
  local err rc
  err=$("$mt" plan "$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -eq 1 && $(printf '%s\n' "$err" | wc -l) -eq 1 && "$err" == "minitrain: error: "*"$needle"* ]]; then
    pass "bad input: $what"
  else
    fail "bad input: $what (rc=$rc, stderr: $err)"
  fi
}
bad "unknown schedule" "pp.schedule" pp=4 grad_accum=8 pp.schedule=2f2b
bad "interleaved with one chunk" "pp.virtual" pp=4 grad_accum=8 pp.schedule=interleaved
bad "interleaved, grad_accum not a multiple of pp" "multiple of pp" pp=4 grad_accum=6 pp.schedule=interleaved pp.virtual=2
bad "no ranks" "pp must be at least 1" pp=0 grad_accum=8

[[ $fails -eq 0 ]] && echo "all plan checks passed"
exit $((fails > 0))
