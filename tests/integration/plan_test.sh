#!/usr/bin/env bash
# `minitrain plan` as a user runs it: a report on stdout with exit status 0 (the pipeline grid and
# bubble, memory per category, bytes per group, step time), --json as one JSON object, a hardware
# file written by `bench --calibrate` read back, and bad input (options, hardware names and files, a
# layout that cannot fit, values beyond the arithmetic's bounds, a search too large) refused with exit
# status 2 and one `minitrain: error:` line; a long search says how far it is on stderr.
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
  if [[ $rc -eq 2 && $(printf '%s\n' "$err" | wc -l) -eq 1 && "$err" == "minitrain: error: "*"$needle"* ]]; then
    pass "bad input: $what"
  else
    fail "bad input: $what (rc=$rc, stderr: $err)"
  fi
}
bad "unknown schedule" "pp.schedule" pp=4 grad_accum=8 pp.schedule=2f2b
bad "interleaved with one chunk" "pp.virtual" pp=4 grad_accum=8 pp.schedule=interleaved
bad "interleaved, grad_accum not a multiple of pp" "multiple of pp" pp=4 grad_accum=6 pp.schedule=interleaved pp.virtual=2 model.n_layer=8
bad "no ranks" "parallel.pp must be positive" pp=0 grad_accum=8
bad "unknown hardware" "hw=b300: not a known hardware name (h100, h200, a100, cpu) and no such file" hw=b300
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo '{"name": "x", "flops": {"fp32": 1, "bf16": 1}}' >"$tmp/bad.json"
bad "hardware file without a field" "hardware file '$tmp/bad.json': missing field 'flops.fp16'" hw="$tmp/bad.json"
echo '{"name": ' >"$tmp/torn.json"
bad "hardware file that is not JSON" "hardware file '$tmp/torn.json' is not valid JSON" hw="$tmp/torn.json"
bad "a layout that cannot fit" "does not fit: needs " model=gpt2-xl hw=a100 batch_size=16 seq_len=1024
bad "no gpus" "gpus must be positive (got 0)" gpus=0
bad "negative gpus" "gpus must be positive (got -1)" gpus=-1
bad "a fraction of a gpu" "gpus must be an integer (got '1.5')" gpus=1.5
bad "a width beyond the arithmetic" "model.n_embd=1000000000 is beyond what minitrain's arithmetic holds" model.n_embd=1000000000
bad "a model beyond the arithmetic" "parameters, beyond what minitrain's arithmetic holds" model.n_embd=1048576 model.n_head=16 model.n_layer=2000
bad "a search beyond its bound" "more than the search's bound of 100000" --search gpus=720720
bad "mixture options of a dense model" "moe.top_k=1 needs a mixture of experts" moe.top_k=1
# `train` refuses the same values with the same line (one parser), before it writes anything.
err=$("$mt" train model.n_embd=1000000000 out_dir="$tmp/never" 2>&1 >/dev/null)
rc=$?
[[ $rc -ne 0 && $(printf '%s\n' "$err" | wc -l) -eq 1 && "$err" == *"model.n_embd=1000000000 is beyond what minitrain's arithmetic holds"* && ! -e "$tmp/never" ]] \
  && pass "train refuses what plan refuses, in the same line" || fail "train refuses what plan refuses (rc=$rc: $err)"
out=$("$mt" plan model=gpt2-xl hw=a100 batch_size=16 seq_len=1024 2>/dev/null)
[[ "$out" == *"activations"*"does not fit: "*"over by "* ]] && pass "the report names the category over"   || fail "the report names the category over ($out)"

out=$("$mt" plan model=gpt2 hw=h100 gpus=16 tp=2 pp=2 grad_accum=8 precision=bf16 tokens=1e9 2>&1)
rc=$?
for part in "memory per rank" "  activations " "tp  (2 ranks): " "pp  (2 ranks): " "send " "   t r0 r1" "MFU " \
            "chip-hours on 16 chips"; do
  [[ $rc -eq 0 && "$out" == *"$part"* ]] && pass "report: $part" || fail "report: $part (rc=$rc: $out)"
done
if "$mt" plan model=gpt2 hw=h100 gpus=8 precision=bf16 --json | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
assert set(j["memory"]) == {"params", "grads", "optimizer", "activations", "comm", "other", "nccl", "total"}, j["memory"]
assert j["layout"]["dp"] == 8 and 0 < j["mfu"] < 1, j'; then
  pass "--json: one object with the metrics.jsonl memory names"
else
  fail "--json: one object with the metrics.jsonl memory names"
fi
if "$mt" bench --calibrate out="$tmp/cpu.json" 2>/dev/null && out=$("$mt" plan hw="$tmp/cpu.json" 2>&1) &&
   [[ "$out" == *"on 1 x cpu-calibrated"* && "$out" == *"gradient passes (zeroing, norms)"* ]] &&
   /usr/bin/python3 -c 'import json, sys; o = json.load(open(sys.argv[1]))["ops"]; assert len(o) == 4 and min(o.values()) > 0, o' "$tmp/cpu.json"; then
  pass "bench --calibrate writes a file plan reads (with the measured op rates)"
else
  fail "bench --calibrate writes a file plan reads ($out)"
fi
# On a machine without a GPU (or a build without CUDA) the GPU calibration says why, in one line.
if ! "$mt" bench --calibrate device=cuda >/dev/null 2>"$tmp/err"; then
  [[ $(wc -l <"$tmp/err") -eq 1 ]] && grep -q "^minitrain: error: bench --calibrate device=cuda: " "$tmp/err" &&
    pass "bench --calibrate device=cuda without a GPU: one line" ||
    fail "bench --calibrate device=cuda without a GPU: one line ($(cat "$tmp/err"))"
fi
bad "a noise scale that is not positive" "noise_scale (B_simple, in tokens) must be positive" noise_scale=0
bad "noise_from a run without an estimate" "noise_from: cannot read $tmp/nothing/metrics.jsonl" noise_from="$tmp/nothing/metrics.jsonl"
# The critical batch: gpt2 at 8 x 1024 tokens per step against a noise scale read from a run's log.
printf '{"step": 1, "gns": {"b_simple": 65536}}\n' >"$tmp/metrics.jsonl"
out=$("$mt" plan model=gpt2 hw=h100 gpus=8 batch_size=1 seq_len=1024 noise_from="$tmp/metrics.jsonl" 2>&1)
[[ "$out" == *"critical batch: B_noise ~ 65.54k tokens vs a global batch of 8.19k tokens"*"below the critical batch"* ]] \
  && pass "critical batch from a run's noise scale" || fail "critical batch from a run's noise scale ($out)"
"$mt" plan model=gpt2 hw=h100 gpus=8 batch_size=16 seq_len=1024 noise_scale=65536 --json | /usr/bin/python3 -c '
import json, sys
c = json.load(sys.stdin)["critical_batch"]
assert c["below"] is False and c["batch_tokens"] == 131072 and abs(c["steps_factor_when_doubled"] - 1.25 / 1.5) < 1e-9, c' \
  && pass "--json: critical_batch" || fail "--json: critical_batch"
# A global batch the request's own dp (gpus) does not divide: the search sizes each layout's micro-batch,
# and tries one-row micro-batches beside the largest.
out=$("$mt" plan --search gpus=16 model=gpt2 seq_len=256 global_batch=8 precision=bf16 hw=h100 top=40 2>&1)
[[ $? -eq 0 && "$out" == *"B=1 accum=1"* && "$out" == *"DP(16)"*"not divisible by dp 16"* ]] && pass "--search with global_batch < gpus" \
  || fail "--search with global_batch < gpus ($out)"
out=$("$mt" plan --search gpus=2 model=gpt2 seq_len=256 global_batch=8 precision=bf16 hw=h100 top=200 2>&1)
[[ "$out" == *"B=4 accum=1"* && "$out" == *"B=1 accum=4"* ]] && pass "--search tries the largest and a one-row micro-batch" \
  || fail "--search tries the largest and a one-row micro-batch ($out)"
out=$("$mt" plan --search gpus=4 model=gpt2 hw=a100 batch_size=8 seq_len=1024 precision=bf16 top=3 2>&1)
[[ $? -eq 0 && "$out" == *"best 3 by predicted tokens/s:"* && "$out" == *": slower: "* ]] && pass "--search" \
  || fail "--search ($out)"

[[ $fails -eq 0 ]] && echo "all plan checks passed"
exit $((fails > 0))
