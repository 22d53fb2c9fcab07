#!/usr/bin/env bash
# Fault campaign: seeded random trials of seven kinds of failure on a 4-rank tiny run (ZeRO-1, async
# checkpoints every 2 steps, 8 steps), each judged against the uninterrupted run of the same config:
#   kill     a random rank SIGKILLed at a random phase (forward, backward, optimizer, staging, write,
#            before_commit, after_commit) and step; scripts/supervise relaunches it with resume=auto.
#            Expected: recovered bitwise.
#   enospc   a random rank's checkpoint write fails with ENOSPC at a random save; supervised.
#            Expected: one error line, from that rank, naming the failed save and "No space left on
#            device", then recovered bitwise.
#   corrupt  a run killed right after committing a random save (2, 4 or 6: one to three checkpoints
#            exist); then one random byte of a random file (manifest or rank
#            file) of a random committed checkpoint is changed, and the run is resumed (resume=auto).
#            Expected: `ckpt verify` refuses the damaged checkpoint with a checksum or format error,
#            and either the resume skips it with that reason and continues bitwise from the next
#            older one (refused), or exits 2 naming it when no checkpoint verifies and changes
#            nothing (refused), or, when the damaged one was not the newest, resumes from the newest
#            (naming the damaged one, if at all, without falling back from the newest) and continues
#            bitwise (recovered). A flip that leaves the manifest's JSON values as they
#            were (white space for white space) is no damage: it must verify and recover bitwise.
#   hang     a random rank stops itself (SIGSTOP) before a random step, dist.timeout=5; supervised.
#            Expected: the job exits 4 (hung) with one "hung:" line from each live rank that timed out
#            (never from the stopped one) and its flight records in out_dir; supervise relaunches
#            it, and it recovers bitwise.
#   straggler a random rank sleeps 100 ms before every step from a random step on. Expected: the run
#            completes bitwise, metrics.jsonl names that rank a straggler in at least half of those
#            steps, and the summary lists it first among the slowest ranks (recovered).
#   preempt  a random rank sends itself SIGTERM in a random step but the last; supervised. Expected:
#            the ranks agree at that step's end, save it, exit 5 (one "preempted" line, no error);
#            supervise relaunches, the run resumes at that step and recovers bitwise.
#   diverge  far too high a learning rate (random, fp32 or fp16 with loss_scale.max_skips=3):
#            expected exit status 3 with one "training diverged at step" line, not relaunched by the
#            supervisor, no exported weights, every checkpoint left behind verifies (refused).
# "Recovered bitwise": the final parameters and AdamW moments (exported from the last checkpoint) and
# the last record of every step's loss equal the uninterrupted run's bit for bit. Anything that is
# neither that nor the expected refusal counts as "anything else".
# Prints a line per trial and a table per kind; exits 1 when "anything else" is not zero.
# Usage: fault_campaign.sh <minitrain> <supervise> [--trials N] [--seed S] [--keep DIR]
#   --trials N   number of trials (default 4); the kinds are dealt round-robin, then shuffled, so N a
#                multiple of the number of kinds (7) covers each kind equally (N=7: one of each)
#   --seed S     seeds every random choice (default: from the clock; printed)
#   --keep DIR   keep the trials' directories and logs in DIR (default: a temporary one, deleted)
set -u
mt=$1
supervise=$2
shift 2
trials=4
seed=$(date +%s)
keep=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --trials) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "fault_campaign: --trials needs a positive number" >&2; exit 2; }
              trials=$2; shift 2 ;;
    --seed) [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "fault_campaign: --seed needs a non-negative number" >&2; exit 2; }
            seed=$2; shift 2 ;;
    --keep) [[ -n ${2:-} ]] || { echo "fault_campaign: --keep needs a directory" >&2; exit 2; }
            keep=$2; shift 2 ;;
    *) echo "fault_campaign: unknown argument '$1' (--trials N, --seed S, --keep DIR)" >&2; exit 2 ;;
  esac
done
py=/usr/bin/python3
if [[ -n $keep ]]; then
  mkdir -p "$keep" && work=$(cd "$keep" && pwd)
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpi=(timeout 300 mpirun --oversubscribe --mca btl self,vader --mca pml ob1 -np 4)
echo "fault_campaign: $trials trial(s), seed $seed"

# shellcheck source=tests/integration/fault_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/fault_common.sh"
fault_setup
bitwise() {  # <run dir>: its final state and losses equal the reference's
  final_state "$1" && cmp -s "$work/ref/final.safetensors" "$1/final.safetensors" \
    && diff <(losses "$work/ref/metrics.jsonl") <(losses "$1/metrics.jsonl") >/dev/null
}
listing() {  # <dir>: every path with its size and mtime, but the lock file (each run rewrites it)
  find "$1" ! -name run.lock -printf '%p %s %T@\n' | sort | md5sum
}
all_verify() {  # <checkpoint root>: every committed checkpoint in it verifies
  local c
  for c in "$1"/step_[0-9]*; do
    [[ -d $c && $c != *.* ]] || continue
    "$mt" ckpt verify "$c" >/dev/null 2>&1 || return 1
  done
}

"${mpi[@]}" "$mt" train "${common[@]}" out_dir="$work/ref" 2>/dev/null || { echo "FAIL reference run"; exit 1; }
final_state "$work/ref" || { echo "FAIL export reference"; exit 1; }

# The plan, drawn once from the seed: one line per trial, "kind key=value ...". (Python's generator,
# not bash's RANDOM: bash reseeds RANDOM in every subshell, so picks made in $(...) do not repeat.)
mapfile -t plan < <("$py" - "$trials" "$seed" <<'PY'
import random, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(seed)
kinds = ["kill", "enospc", "corrupt", "diverge", "hang", "straggler", "preempt"]
deal = [kinds[i % len(kinds)] for i in range(n)]
rng.shuffle(deal)
kill_phases = ["forward", "backward", "optimizer", "staging", "write", "before_commit", "after_commit"]
for kind in deal:
    rank = rng.randrange(4)
    if kind == "kill":
        phase = rng.choice(kill_phases)
        # compute phases in steps 1-8; save phases in the saves after steps 2, 4, 6 (8 is the end)
        step = rng.randrange(1, 9) if phase in kill_phases[:3] else rng.choice([2, 4, 6])
        print(f"kill phase={phase} step={step} rank={rank}")
    elif kind == "enospc":
        print(f"enospc step={rng.choice([2, 4, 6])} rank={rank}")
    elif kind == "corrupt":
        # killed after the commit of a save; then which checkpoint, which file, which byte (as
        # fractions of what exists then) and the xor mask
        print(f"corrupt step={rng.choice([2, 4, 6])} rank={rank} ckpt={rng.random():.6f} file={rng.random():.6f} "
              f"byte={rng.random():.6f} xor={rng.randrange(1, 256)}")
    elif kind == "diverge":
        print(f"diverge lr={rng.choice(['3e3', '1e4', '3e4', '1e5'])} precision={rng.choice(['fp32', 'fp16'])}")
    elif kind == "hang":
        print(f"hang step={rng.randrange(1, 9)} rank={rank}")
    elif kind == "straggler":
        print(f"straggler step={rng.randrange(1, 8)} rank={rank}")
    else:  # SIGTERM in a step before the last (at the last one the run ends anyway)
        print(f"preempt step={rng.randrange(1, 8)} rank={rank}")
PY
)

declare -A n_trials n_recovered n_refused n_other
for k in kill enospc corrupt diverge hang straggler preempt; do n_trials[$k]=0; n_recovered[$k]=0; n_refused[$k]=0; n_other[$k]=0; done
t=0
for line in "${plan[@]}"; do
  t=$((t + 1))
  read -r kind args <<<"$line"
  declare -A a=()
  for kv in $args; do a[${kv%%=*}]=${kv#*=}; done
  out="$work/t$t"
  outcome=other
  detail=""
  case $kind in
    kill|enospc)
      phase=${a[phase]:-enospc}
      "$supervise" --max-restarts 3 --ckpt-dir "$out/checkpoints" --metrics "$out/metrics.jsonl" --log "$out.supervise.log" -- \
        "${mpi[@]}" "$mt" train "${common[@]}" out_dir="$out" \
        ckpt.fault_phase="$phase" ckpt.fault_step="${a[step]}" ckpt.fault_rank="${a[rank]}" >"$out.log" 2>&1
      rc=$?
      if [[ $kind == kill ]]; then
        fired=$(grep -ac "^\[fault\] rank ${a[rank]}: SIGKILL at step ${a[step]}, phase $phase" "$out.log")
        right_error=1
      else
        fired=$(grep -ac "No space left on device" "$out.log")
        # One error line, from the rank whose disk "filled", naming the save; the relaunch has none.
        errors=$(grep -ac 'error:' "$out.log")
        right_error=$(grep -ac "\[rank ${a[rank]}\] error: checkpoint save of step ${a[step]} .*No space left on device" "$out.log")
        [[ $errors -eq 1 ]] || right_error=0
      fi
      if [[ $rc -eq 0 && $fired -ge 1 && $right_error -eq 1 ]] && bitwise "$out"; then
        outcome=recovered
      else
        detail="(supervise rc=$rc, fault fired: $fired, right error: $right_error)"
      fi
      what="$phase at step ${a[step]} on rank ${a[rank]}" ;;
    corrupt)
      "${mpi[@]}" "$mt" train "${common[@]}" out_dir="$out" \
        ckpt.fault_phase=after_commit ckpt.fault_step="${a[step]}" ckpt.fault_rank="${a[rank]}" >"$out.log" 2>&1
      fired=$(grep -ac '^\[fault\] rank' "$out.log")
      # Damage one byte; the Python prints "<checkpoint dir> <file> <offset> <newest?> <the next older
      # checkpoint, or -> <the newest checkpoint> <damage?>".
      read -r cdir cfile off newest older newest_name damage < <("$py" - "$out/checkpoints" "${a[ckpt]}" "${a[file]}" "${a[byte]}" "${a[xor]}" <<'PY'
import glob, json, os, sys
root, fc, ff, fb, mask = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
ckpts = sorted(d for d in glob.glob(os.path.join(root, "step_*")) if "." not in os.path.basename(d))
if not ckpts:
    print("- - - 0 - - 0"); sys.exit()
c = ckpts[int(fc * len(ckpts))]
files = sorted(glob.glob(os.path.join(c, "*")))
f = files[int(ff * len(files))]
data = bytearray(open(f, "rb").read())
at = int(fb * len(data))
before = bytes(data)
data[at] ^= mask
with open(f, "wb") as out:
    out.write(data)
damage = 1
if f.endswith(".json"):
    try:
        damage = int(json.loads(before) != json.loads(bytes(data)))
    except ValueError:
        damage = 1
i = ckpts.index(c)
print(os.path.basename(c), os.path.basename(f), at, int(c == ckpts[-1]), os.path.basename(ckpts[i - 1]) if i else "-",
      os.path.basename(ckpts[-1]), damage)
PY
)
      what="byte $off of $cdir/$cfile ^${a[xor]} (killed at step ${a[step]}; $([[ $newest == 1 ]] && echo newest || echo older))"
      verify_msg=$("$mt" ckpt verify "$out/checkpoints/$cdir" 2>&1)
      verify_rc=$?
      before=$(listing "$out/checkpoints")
      "${mpi[@]}" "$mt" train "${common[@]}" out_dir="$out" \
        ckpt.fault_phase=after_commit ckpt.fault_step="${a[step]}" ckpt.fault_rank="${a[rank]}" resume=auto >"$out.resume.log" 2>&1
      rc=$?
      reason='checksum mismatch|corrupt|malformed|not a minitrain checkpoint|truncated|expected'
      refused_ok=$(printf '%s\n' "$verify_msg" | grep -acE "$reason")
      if [[ $fired -eq 0 || $cdir == - ]]; then
        detail="(the kill before the damage fired: $fired; checkpoint damaged: $cdir)"
      elif [[ $damage -eq 0 ]]; then
        # White space for white space in the manifest: nothing was damaged, so nothing may be refused.
        if [[ $verify_rc -eq 0 && $rc -eq 0 ]] && bitwise "$out"; then outcome=recovered; what="$what, JSON unchanged"; fi
      elif [[ $verify_rc -ne 1 || $refused_ok -eq 0 ]]; then
        detail="(ckpt verify did not refuse it: rc=$verify_rc, $verify_msg)"
      elif [[ $newest == 1 && $older == - ]]; then
        # The only checkpoint: resume=auto must fail naming it and change nothing.
        if [[ $rc -eq 2 && $(grep -ac 'minitrain: error:' "$out.resume.log") -eq 1 ]] \
           && grep -aqE "minitrain: error: .*none of the 1 checkpoint\(s\).*$cdir \(.*($reason)" "$out.resume.log" \
           && [[ $(listing "$out/checkpoints") == "$before" ]]; then
          outcome=refused
        fi
      elif [[ $newest == 1 ]]; then
        if [[ $rc -eq 0 ]] && grep -aqE "skipping .*$cdir: .*($reason)" "$out.resume.log" \
           && grep -aq "resuming from .*/$older (step" "$out.resume.log" && bitwise "$out"; then
          outcome=refused
        fi
      else
        # The newest verifies and is resumed (the damaged one may be named, but not fallen back from).
        if [[ $rc -eq 0 ]] && grep -aq "resuming from .*/$newest_name (step" "$out.resume.log" \
           && ! grep -aq "skipping .*$cdir: .*trying the next older one" "$out.resume.log" && bitwise "$out" \
           && ls -d "$out/checkpoints/$cdir"* >/dev/null 2>&1; then
          outcome=recovered
        fi
      fi
      [[ $outcome == other && -z $detail ]] && detail="(resume rc=$rc; verify: $verify_msg; resume log: $(grep -aE 'error|skipping|resuming' "$out.resume.log" | head -3))" ;;
    hang)
      "$supervise" --max-restarts 3 --ckpt-dir "$out/checkpoints" --metrics "$out/metrics.jsonl" --log "$out.supervise.log" -- \
        "${mpi[@]}" "$mt" train "${common[@]}" out_dir="$out" dist.timeout=5 \
        ckpt.fault_phase=hang ckpt.fault_step="${a[step]}" ckpt.fault_rank="${a[rank]}" >"$out.log" 2>&1
      rc=$?
      what="SIGSTOP before step ${a[step]} on rank ${a[rank]}"
      fired=$(grep -ac "^\[fault\] rank ${a[rank]}: SIGSTOP at step ${a[step]}$" "$out.log")
      # Every error line is a live rank's "hung:" line, each with its flight records written.
      hung=$(grep -acE "^minitrain: \[rank [0-9]+\] error: hung: .* #[0-9]+ .*on group '[a-z_]+'" "$out.log")
      errors=$(grep -ac 'error:' "$out.log")
      records=1
      for r in $(grep -aoE '^minitrain: \[rank [0-9]+\] error: hung:' "$out.log" | grep -oE '[0-9]+'); do
        [[ $r -ne ${a[rank]} && -s $out/flight_recorder.rank$r.jsonl ]] || records=0
      done
      if [[ $rc -eq 0 && $fired -eq 1 && $hung -ge 1 && $errors -eq $hung && $records -eq 1 ]] \
         && grep -aq 'attempt 1 failed: exit status 4 ' "$out.supervise.log" && bitwise "$out"; then
        outcome=recovered
      else
        detail="(supervise rc=$rc, fault fired: $fired, hung lines: $hung of $errors errors, records: $records)"
      fi ;;
    straggler)
      "${mpi[@]}" "$mt" train "${common[@]}" out_dir="$out" \
        ckpt.fault_phase=straggler ckpt.fault_step="${a[step]}" ckpt.fault_rank="${a[rank]}" >"$out.log" 2>&1
      rc=$?
      what="100 ms a step from step ${a[step]} on rank ${a[rank]}"
      named=$("$py" - "$out/metrics.jsonl" "${a[step]}" "${a[rank]}" <<'PY'
import json, sys
path, first, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
steps = {}
for line in open(path):
    j = json.loads(line)
    if "loss" in j and j["step"] >= first:
        steps[j["step"]] = j.get("straggler", {}).get("rank") == rank
print(int(len(steps) > 0 and 2 * sum(steps.values()) >= len(steps)))
PY
)
      if [[ $rc -eq 0 && $named -eq 1 ]] && grep -aqE "^  slowest ranks +rank ${a[rank]} x" "$out.log" && bitwise "$out"; then
        outcome=recovered
      else
        detail="(rc=$rc, named in half the steps: $named; $(grep -a 'slowest ranks' "$out.log"))"
      fi ;;
    preempt)
      "$supervise" --max-restarts 3 --ckpt-dir "$out/checkpoints" --metrics "$out/metrics.jsonl" --log "$out.supervise.log" -- \
        "${mpi[@]}" "$mt" train "${common[@]}" out_dir="$out" \
        ckpt.fault_phase=preempt ckpt.fault_step="${a[step]}" ckpt.fault_rank="${a[rank]}" >"$out.log" 2>&1
      rc=$?
      what="SIGTERM in step ${a[step]} on rank ${a[rank]}"
      fired=$(grep -ac "^\[fault\] rank ${a[rank]}: SIGTERM at step ${a[step]}," "$out.log")
      saved=$(grep -ac "^minitrain: preempted (SIGTERM): saved step ${a[step]} in " "$out.log")
      if [[ $rc -eq 0 && $fired -eq 1 && $saved -eq 1 && $(grep -ac 'error:' "$out.log") -eq 0 ]] \
         && grep -aq 'attempt 1 failed: exit status 5 ' "$out.supervise.log" \
         && grep -aq "resumed from .*step_0*${a[step]} (step ${a[step]})" "$out.log" && bitwise "$out"; then
        outcome=recovered
      else
        detail="(supervise rc=$rc, fault fired: $fired, saved line: $saved)"
      fi ;;
    diverge)
      "$supervise" --max-restarts 3 --ckpt-dir "$out/checkpoints" --metrics "$out/metrics.jsonl" --log "$out.supervise.log" -- \
        "${mpi[@]}" "$mt" train "${common[@]}" out_dir="$out" optim.lr="${a[lr]}" optim.grad_clip=0 \
        optim.warmup_steps=0 precision="${a[precision]}" loss_scale.max_skips=3 >"$out.log" 2>&1
      rc=$?
      what="lr ${a[lr]}, ${a[precision]}"
      if [[ $rc -eq 3 && $(grep -ac 'minitrain: error:' "$out.log") -eq 1 ]] \
         && grep -aq 'minitrain: error: training diverged at step ' "$out.log" \
         && grep -aq 'giving up: training diverged' "$out.supervise.log" \
         && [[ $(grep -ac '] attempt [0-9]*:' "$out.supervise.log") -eq 1 && ! -e $out/model.safetensors ]] \
         && all_verify "$out/checkpoints"; then
        outcome=refused
        what="$what: $(grep -ao 'training diverged at step [0-9]*' "$out.log")"
      else
        detail="(supervise rc=$rc: $(grep -a 'error:' "$out.log" | head -2))"
      fi ;;
  esac
  unset a
  n_trials[$kind]=$((n_trials[$kind] + 1))
  case $outcome in
    recovered) n_recovered[$kind]=$((n_recovered[$kind] + 1)); word="recovered bitwise" ;;
    refused) n_refused[$kind]=$((n_refused[$kind] + 1)); word="refused with a correct error" ;;
    *) n_other[$kind]=$((n_other[$kind] + 1)); word="ANYTHING ELSE $detail" ;;
  esac
  printf 'trial %d/%d %-7s %s: %s\n' "$t" "$trials" "$kind" "$what" "$word"
  [[ $outcome == other ]] && tail -3 "$out.log" | sed 's/^/    /'
done

echo
echo "| kind | trials | recovered bitwise | refused with a correct error | anything else |"
echo "|---|---|---|---|---|"
others=0
for k in kill enospc corrupt diverge hang straggler preempt; do
  echo "| $k | ${n_trials[$k]} | ${n_recovered[$k]} | ${n_refused[$k]} | ${n_other[$k]} |"
  others=$((others + n_other[$k]))
done
[[ $others -eq 0 ]]
