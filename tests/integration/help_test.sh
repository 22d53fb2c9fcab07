#!/usr/bin/env bash
# Every command and subcommand answers -h and --help with exit status 0 and its usage on stdout (not
# "--help is not a directory"); --version names the
# git revision and the build; `train --help` lists what the parser takes (a key given from the help
# is accepted). Usage: help_test.sh <minitrain binary>
set -u
mt=$1
fails=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

for cmd in train bench sample data "data prepare" "data inspect" ckpt "ckpt ls" "ckpt verify" "ckpt export" "ckpt bench" plan plot selftest; do
  for h in -h --help; do
    if out=$("$mt" $cmd $h 2>/dev/null) && [[ "$out" == *usage:* ]]; then pass "$cmd $h"; else fail "$cmd $h"; fi
  done
done
out=$("$mt" train steps=3 --help) && [[ "$out" == *"model.n_layer"* && "$out" == *"optimizer:"* ]] \
  && pass "train --help after options lists the grouped keys" || fail "train --help after options lists the grouped keys"
out=$("$mt" sample --help) && [[ "$out" == *"--temperature"* && "$out" == *"--top_k"* ]] \
  && pass "sample --help lists its flags" || fail "sample --help lists its flags"
out=$("$mt" --version) && [[ "$out" == *"git "* && "$out" == *"CUDA "* && "$out" == *"MPI "* && "$out" == *"compiler"* ]] \
  && pass "--version" || fail "--version"
# A flag outside sample's table is refused, naming it.
err=$("$mt" sample --model x --bogus 1 2>&1); rc=$?
[[ $rc == 1 && "$err" == *"--bogus"* ]] && pass "unknown sample flag" || fail "unknown sample flag ($rc: $err)"
exit $((fails > 0))
