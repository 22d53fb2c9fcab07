#!/usr/bin/env bash
# End-to-end checks of the minitrain command as a user runs it:
#  - two identical runs write identical loss lines to metrics.jsonl;
#  - a run exports weights that `sample` reads, and `--resume` continues a stopped run exactly;
#  - each bad input fails with exit status 2 (train: refused) or 1, one `minitrain: error:` line naming the cause, and
#    leaves no output directory behind;
#  - a diverging run stops with exit status 3 (also under mpirun), exports nothing, and leaves only
#    checkpoints that verify;
#  - an edited manifest fails verify and ls; ckpt export takes a root or its latest; a failed save
#    under mpirun prints one error, from the rank that failed.
# Usage: cli_test.sh <minitrain binary> <python3 with numpy>
set -u
mt=$1
py=${2:-/usr/bin/python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

# A small corpus, prepared with the data CLI.
for i in $(seq 1 200); do printf 'document %d says %d and %d.\n%%\n' "$i" $((i * 7 % 13)) $((i * 3 % 11)); done > "$work/corpus.txt"
"$mt" data prepare --input "$work/corpus.txt" --out "$work/data" --splitter fortune --vocab 300 >/dev/null 2>&1 \
  || { echo "FAIL data prepare"; exit 1; }
common=(model=tiny model.vocab_size=300 model.n_layer=2 model.n_embd=32 model.n_head=4 model.block_size=32
        seq_len=32 batch_size=4 log_every=100 data.path="$work/data" threads=1)

losses() { "$py" -c 'import json,sys
for l in open(sys.argv[1]):
    j=json.loads(l)
    if "loss" in j: print(j["step"], repr(j["loss"]))' "$1"; }

"$mt" train "${common[@]}" steps=6 out_dir="$work/a" 2>/dev/null || fail "train a"
"$mt" train "${common[@]}" steps=6 out_dir="$work/b" 2>/dev/null || fail "train b"
if [[ -s "$work/a/metrics.jsonl" ]] && diff <(losses "$work/a/metrics.jsonl") <(losses "$work/b/metrics.jsonl") >/dev/null; then
  pass "identical runs give identical JSONL losses"
else
  fail "identical runs give identical JSONL losses"
fi

# Stop after 3 steps, resume to 6: the same losses as the uninterrupted run.
"$mt" train "${common[@]}" steps=6 out_dir="$work/c" 2>/dev/null >/dev/null || fail "train c"
"$mt" train "${common[@]}" steps=3 out_dir="$work/d" 2>/dev/null || fail "train d"
"$mt" train "${common[@]}" steps=6 out_dir="$work/d" resume=auto 2>/dev/null || fail "resume d"
if diff <(losses "$work/c/metrics.jsonl") <(losses "$work/d/metrics.jsonl") >/dev/null; then
  pass "stop and resume gives the uninterrupted losses"
else
  fail "stop and resume gives the uninterrupted losses"
fi

# Every byte a resume reads is checksummed, the manifest's own values too: an edited update count or
# loader position fails `ckpt verify`, and `ckpt ls` (which verifies what it lists) says damaged.
for key in updates data; do
  rm -rf "$work/edited" && cp -r "$work/c/checkpoints" "$work/edited"
  m=$(ls -d "$work"/edited/step_* | tail -1)/manifest.json
  "$py" - "$m" "$key" <<'PY'
import json, sys
path, key = sys.argv[1:]
m = json.load(open(path))
m["meta"][key] = m["meta"][key] + 1 if key == "updates" else {**m["meta"][key], "edited": 1}
json.dump(m, open(path, "w"), indent=1)
PY
  out=$("$mt" ckpt verify "${m%/manifest.json}" 2>&1)
  rc=$?
  ls_out=$("$mt" ckpt ls "$work/edited" 2>&1)
  if [[ $rc -eq 1 && "$out" == *"manifest checksum mismatch"* && "$ls_out" == *"DAMAGED"*"manifest checksum mismatch"* ]]; then
    pass "an edited manifest ($key) fails verify and ls"
  else
    fail "an edited manifest ($key) fails verify and ls (rc=$rc: $out / $ls_out)"
  fi
done

out=$("$mt" sample --model "$work/a/model.safetensors" --tokenizer "$work/data/tokenizer.json" --text "document" \
      --tokens 8 --seed 3 2>&1) && [[ "$out" == document* ]] && pass "sample decodes text" || fail "sample: $out"

# Bad inputs: exit 2 for train (refused), 1 for the other commands, exactly one error line on stderr naming the culprit, nothing created.
bad() {
  local what=$1 needle=$2
  shift 2
  local err rc
  err=$("$mt" "$@" 2>&1 >/dev/null)
  rc=$?
  local want=1
  [[ $1 == train ]] && want=2  # refused before the first step (runtime/exit_status.h)
  if [[ $rc -eq $want && $(printf '%s\n' "$err" | grep -c 'error') -eq 1 && "$err" == *"minitrain: error:"*"$needle"* && ! -e "$work/never" ]]; then
    pass "bad input: $what"
  else
    fail "bad input: $what (rc=$rc, stderr: $err)"
  fi
}
printf '{"steps": 3,,}' > "$work/bad.json"
printf 'MTTOKENS-truncated' > "$work/short.bin"
bad "unknown key" "no_such_key" train "${common[@]}" no_such_key=1 out_dir="$work/never"
bad "unknown flag" "--bogus" train "${common[@]}" --bogus 1 out_dir="$work/never"
bad "malformed JSON" "bad.json" train --config "$work/bad.json" out_dir="$work/never"
bad "missing data file" "missing.bin" train "${common[@]}" data.path="$work/missing.bin" out_dir="$work/never"
bad "truncated data file" "short.bin" train "${common[@]}" data.path="$work/short.bin" out_dir="$work/never"
bad "data vocabulary larger than the model's" "vocab" train "${common[@]}" model.vocab_size=100 out_dir="$work/never"
bad "non-positive size" "batch_size" train "${common[@]}" batch_size=0 out_dir="$work/never"
bad "n_embd % n_head" "n_head" train "${common[@]}" model.n_head=5 out_dir="$work/never"
bad "sequence longer than the context" "block_size" train "${common[@]}" seq_len=64 out_dir="$work/never"
bad "state of another model shape" "another model shape" train "${common[@]}" model.n_layer=3 \
    resume="$work/a/checkpoints" out_dir="$work/never"
bad "weights of another model shape" "shape" train "${common[@]}" model.n_embd=64 \
    init_from="$work/a/model.safetensors" out_dir="$work/never"
bad "existing run directory" "already holds a run" train "${common[@]}" steps=1 out_dir="$work/a"
# Checkpoints that all fail to verify are refused by resume=auto, naming each, not trained over.
for f in "$work"/d/checkpoints/step_*/rank_*.bin; do truncate -s -1 "$f"; done
# Every path with its size and mtime (to the nanosecond), but the lock file, which each run rewrites
# with its pid and host when it takes the lock.
listing() { find "$1" ! -name run.lock -printf '%p %s %T@\n' | sort | md5sum; }
before=$(listing "$work/d")
bad "no checkpoint verifies" "resume=fresh" train "${common[@]}" steps=6 out_dir="$work/d" resume=auto
[[ $(listing "$work/d") == "$before" ]] && pass "a refused resume touches nothing" || fail "a refused resume touches nothing"

# A diverging run (far too high a learning rate, no clipping): exit status 3, one error line naming
# the step, no exported weights, and every checkpoint it left verifies.
diverged() {
  local what=$1 run=$2
  shift 2
  local err rc
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  if [[ $rc -eq 3 && $(printf '%s\n' "$err" | grep -c 'minitrain: error:') -eq 1 && "$err" == *"minitrain: error: training diverged at step "* \
        && ! -e "$run/model.safetensors" ]] && "$mt" ckpt verify "$run/checkpoints" >/dev/null 2>&1; then
    pass "$what"
  else
    fail "$what (rc=$rc, stderr: $(printf '%s\n' "$err" | grep 'minitrain: error:'))"
  fi
}
diverge=(optim.lr=1e4 optim.grad_clip=0 optim.warmup_steps=0 steps=20 save_every=1 ckpt.keep=2)
diverged "diverged run: exit 3, finite checkpoints only" "$work/div" \
  "$mt" train "${common[@]}" "${diverge[@]}" out_dir="$work/div"

# `data prepare` on empty input: one error line, and no --out directory left behind.
: > "$work/empty.txt"
err=$("$mt" data prepare --input "$work/empty.txt" --out "$work/empty_out" --vocab 300 2>&1 >/dev/null)
rc=$?
[[ $rc -eq 1 && $(printf '%s\n' "$err" | grep -c 'error') -eq 1 && "$err" == *"no documents"* && ! -e "$work/empty_out" ]] \
  && pass "data prepare of empty input leaves nothing" || fail "data prepare of empty input leaves nothing (rc=$rc: $err)"

# `ckpt export` takes a checkpoint, a root (its newest checkpoint that verifies) or the root's latest;
# the ckpt usage lists it.
"$mt" ckpt export "$work/c/checkpoints/step_000006" "$work/exp_step.safetensors" >/dev/null 2>&1
"$mt" ckpt export "$work/c/checkpoints" "$work/exp_root.safetensors" >/dev/null 2>&1
"$mt" ckpt export "$work/c/checkpoints/latest" "$work/exp_latest.safetensors" >/dev/null 2>&1
if [[ -s "$work/exp_step.safetensors" ]] && cmp -s "$work/exp_step.safetensors" "$work/exp_root.safetensors" \
   && cmp -s "$work/exp_step.safetensors" "$work/exp_latest.safetensors"; then
  pass "ckpt export resolves a root and its latest"
else
  fail "ckpt export resolves a root and its latest"
fi
[[ $("$mt" ckpt 2>&1) == *"ckpt export"* ]] && pass "ckpt usage lists export" || fail "ckpt usage lists export"

# Bad layouts under mpirun: one error line (from rank 0), non-zero exit, no hang.
if command -v mpirun >/dev/null; then
  mpi=(mpirun --oversubscribe --mca btl self,vader --mca pml ob1)
  bad_mpi() {
    local what=$1 needle=$2
    shift 2
    local err rc
    err=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 "${mpi[@]}" "$@" 2>&1 >/dev/null)
    rc=$?
    local lines
    lines=$(printf '%s\n' "$err" | grep -c 'minitrain: error:')
    if [[ $rc -ne 0 && $rc -ne 124 && $lines -eq 1 && "$err" == *"$needle"* && ! -e "$work/never" ]]; then
      pass "bad layout: $what"
    else
      fail "bad layout: $what (rc=$rc, stderr: $err)"
    fi
  }
  bad_mpi "product is not the world size" "world has 3 ranks" -np 3 "$mt" train "${common[@]}" --dp 2 out_dir="$work/never"
  bad_mpi "seq_len not divisible by 2 cp" "--cp 2: seq_len 30 must be divisible by 2 x cp = 4" -np 2 "$mt" train "${common[@]}" --cp 2 seq_len=30 out_dir="$work/never"
  bad_mpi "cp with materialized attention" "--cp 2 needs attention=flash" -np 2 "$mt" train "${common[@]}" --cp 2 attention=materialized out_dir="$work/never"
  bad_mpi "more pipeline stages than layers" "--pp 4" -np 4 "$mt" train "${common[@]}" --pp 4 out_dir="$work/never"
  bad_mpi "heads not divisible by tp" "4 attention heads" -np 3 "$mt" train "${common[@]}" --tp 3 out_dir="$work/never"
  bad_mpi "sequence parallelism without tp" "tp.sp=true" -np 2 "$mt" train "${common[@]}" tp.sp=true out_dir="$work/never"
  bad_mpi "dp larger than the batch allows" "global_batch" -np 3 "$mt" train "${common[@]}" global_batch=2 out_dir="$work/never"
  bad_mpi "bucket size" "bucket_mb" -np 2 "$mt" train "${common[@]}" bucket_mb=0 out_dir="$work/never"
  bad_mpi "missing data file on every rank" "missing.bin" -np 2 "$mt" train "${common[@]}" data.path="$work/missing.bin" out_dir="$work/never"
  # A failed save (an injected ENOSPC) on either rank: one error line, from the rank that failed, saying
  # what failed; not the other rank's view of it (a save directory that vanished).
  for r in 0 1; do
    err=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 "${mpi[@]}" -np 2 "$mt" train "${common[@]}" \
          steps=6 save_every=2 ckpt.fault_phase=enospc ckpt.fault_step=4 ckpt.fault_rank=$r out_dir="$work/enospc$r" 2>&1 >/dev/null)
    rc=$?
    if [[ $rc -ne 0 && $rc -ne 124 && $(printf '%s\n' "$err" | grep -c 'error:') -eq 1 \
          && "$err" == *"[rank $r] error: checkpoint save of step 4"*"No space left on device"* ]]; then
      pass "ENOSPC on rank $r under mpirun: one error, from rank $r"
    else
      fail "ENOSPC on rank $r under mpirun: one error, from rank $r (rc=$rc, stderr: $(printf '%s\n' "$err" | grep 'error:'))"
    fi
  done
  diverged "diverged run under mpirun: exit 3" "$work/div2" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    timeout 120 "${mpi[@]}" -np 2 "$mt" train "${common[@]}" "${diverge[@]}" --zero 1 out_dir="$work/div2"
fi

# Tensor parallelism end to end: tp=2 x dp=2 follows the single-rank run of the same global batch,
# logs its tp bytes, and its weights (exported from the checkpoint) sample.
if command -v mpirun >/dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 "${mpi[@]}" -np 4 "$mt" train "${common[@]}" \
      data.mode=shuffled batch_size=2 steps=4 --tp 2 out_dir="$work/tp2" 2>/dev/null || fail "train tp=2 dp=2"
  "$mt" train "${common[@]}" data.mode=shuffled batch_size=4 steps=4 out_dir="$work/tp1" 2>/dev/null || fail "train tp=1"
  if "$py" - "$work/tp1/metrics.jsonl" "$work/tp2/metrics.jsonl" <<'PY'
import json, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
a, b = ([j["loss"] for j in r if "loss" in j] for r in runs)
assert len(a) == len(b) == 4, (a, b)
assert max(abs(x - y) / abs(x) for x, y in zip(a, b)) < 1e-5, (a, b)
assert all(j["comm_tp"]["all_gather"]["sent_bytes"] > 0 for j in runs[1] if "loss" in j)
PY
  then pass "tp=2 x dp=2 follows the single-rank losses"; else fail "tp=2 x dp=2 follows the single-rank losses"; fi
  out=$("$mt" sample --model "$work/tp2/model.safetensors" --tokenizer "$work/data/tokenizer.json" --text "document" \
        --tokens 8 --seed 3 2>&1) && [[ "$out" == document* ]] && pass "sample a tp-trained model" || fail "sample tp: $out"
fi

# Context parallelism end to end: cp=2 (zigzag chunks, ring attention) with packed-document masks follows
# the single-rank run, logs the ring's bytes per step, and its final checkpoint exports weights that sample.
if command -v mpirun >/dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 "${mpi[@]}" -np 2 "$mt" train "${common[@]}" \
      data.mode=shuffled data.doc_mask=true steps=4 --cp 2 out_dir="$work/cp2" 2>/dev/null || fail "train cp=2"
  "$mt" train "${common[@]}" data.mode=shuffled data.doc_mask=true attention=flash steps=4 out_dir="$work/cp1" \
      2>/dev/null || fail "train cp=1"
  if "$py" - "$work/cp1/metrics.jsonl" "$work/cp2/metrics.jsonl" <<'PY'
import json, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
a, b = ([j["loss"] for j in r if "loss" in j] for r in runs)
assert len(a) == len(b) == 4, (a, b)
assert max(abs(x - y) / abs(x) for x, y in zip(a, b)) < 1e-5, (a, b)
assert all(j["comm_cp"]["send"]["sent_bytes"] > 0 for j in runs[1] if "loss" in j)
PY
  then pass "cp=2 follows the single-rank losses"; else fail "cp=2 follows the single-rank losses"; fi
  out=$("$mt" sample --model "$work/cp2/model.safetensors" --tokenizer "$work/data/tokenizer.json" --text "document" \
        --tokens 8 --seed 3 2>&1) && [[ "$out" == document* ]] && pass "sample a cp-trained model" || fail "sample cp: $out"
fi

# An MFU above 100% (a peak given far too low) is reported on stderr with both of its causes.
err=$("$mt" bench model=tiny model.n_layer=1 seq_len=32 batch_size=1 steps=1 warmup=0 threads=1 peak_flops=1e6 2>&1 >/dev/null)
if [[ "$err" == *"is above 100%: the peak given as peak_flops= is below what the step reached, and the model FLOPs count attention's whole T x T ("*"% of them here), of which a causal step computes about half. MFU of FMA peak ("*"%) has no calibration in it."* ]]; then
  pass "bench explains an MFU above 100%"
else
  fail "bench explains an MFU above 100%: $err"
fi

# All four dimensions in one bench: tp2 x cp2 x pp2 x dp2 on 16 ranks prints the bytes of each group.
if command -v mpirun >/dev/null; then
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 "${mpi[@]}" -np 16 "$mt" bench model=tiny \
        model.n_layer=2 seq_len=64 batch_size=2 threads=1 --tp 2 --cp 2 --pp 2 --dp 2 2>/dev/null)
  if [[ "$out" == *"TP(2)-CP(2)-PP(2)-DP(2), sp "* && "$out" == *"bytes/step/rank cp x dp | all_reduce"* \
        && "$out" == *"bytes/step/rank tp "* && "$out" == *"bytes/step/rank pp "*"send"* \
        && "$out" == *"bytes/step/rank cp "*"| send 128.0 KiB (4 calls)"* ]]; then
    pass "bench on tp2 x cp2 x pp2 x dp2 prints the bytes per group"
  else
    fail "bench on tp2 x cp2 x pp2 x dp2: $out"
  fi
fi

# Expert parallelism in bench: ep2 on 2 ranks prints the ep group's token all-to-alls (five per mixture
# layer: counts, rows out and back in forward, and again in backward), beside the experts' share of
# the gradient norm gathered over the group. With the op profile, each ep rank's time in the exchanges
# beside the rows its experts drew: one mixture layer, 2 ranks x 128 tokens x top-2 = 512 rows a step.
if command -v mpirun >/dev/null; then
  out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 "${mpi[@]}" -np 2 "$mt" bench model=tiny-moe \
        model.n_layer=2 seq_len=64 batch_size=2 steps=2 warmup=1 threads=1 --ep 2 profile_ops=1 2>/dev/null)
  if [[ "$out" == *"bytes/step/rank ep "*" all_to_all "*"(5 calls)"* ]]; then
    pass "bench on ep2 prints the token all-to-all bytes"
  else
    fail "bench on ep2: $out"
  fi
  # The CPU's peak is calibrated before the steps and after each measured one (on every rank at
  # once), and the fastest reading kept: 1 + 2 readings here.
  if [[ "$out" =~ \|\ peak\ +\|\ ([0-9.]+)\ GFLOP/s\ .*the\ fastest\ of\ 3\ readings,\ before\ the\ steps\ and\ after\ each:\ ([0-9., ]+)\) ]] \
      && awk -v p="${BASH_REMATCH[1]}" -v list="${BASH_REMATCH[2]}" \
           'BEGIN { n = split(list, r, ", "); m = 0; for (i = 1; i <= n; i++) if (r[i] + 0 > m) m = r[i] + 0; exit !(n == 3 && p + 0 == m) }'; then
    pass "bench keeps the fastest of the calibrations before the steps and after each"
  else
    fail "bench's peak row names every calibration and keeps the fastest: $out"
  fi
  # Beside it, MFU against the cores' FMA limit, read at the same points.
  if [[ "$out" =~ \|\ MFU\ of\ FMA\ peak\ +\|\ [0-9.]+%\ of\ [0-9.]+\ GFLOP/s\ \((AVX-512|AVX2|portable)\ FMAs\ on\ registers\ alone,\ 1\ thread:\ .*the\ fastest\ of\ [0-9.]+,\ [0-9.]+,\ [0-9.]+\)\ \| ]]; then
    pass "bench prints MFU against the FMA peak, read before the steps and after each"
  else
    fail "bench's MFU of FMA peak row: $out"
  fi
  row=$(grep "ep exchange per rank" <<<"$out" || true)
  drawn=$(grep -o "drew [0-9]* rows" <<<"$row" | awk '{s += $2} END {print s + 0}')
  if [[ "$row" == *"ep rank 0: "*" ms"*"ep rank 1: "* && "$drawn" == 512 \
        && "$out" == *"ep exchange blocking"*" ms for a step's ep all-to-all bytes"* \
        && "$out" == *"host: ep exchange "*"|        5.0 |"* ]]; then
    pass "bench on ep2 with profile_ops=1 puts each rank's exchange time beside its experts' 512 rows"
  else
    fail "bench on ep2 with profile_ops=1 (rows drawn: $drawn): $out"
  fi
fi

echo "cli_test: $fails failure(s)"
[[ $fails -eq 0 ]]
