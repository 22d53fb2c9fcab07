#!/usr/bin/env bash
# docs/launch.md's launch forms, run on this machine's CPUs at toy size: the single-node mpirun line
# (ranks mapped ppr:N:node with cores of their own, environment passed with -x), the hostfile form (a
# hostfile naming localhost with slots), and scripts/slurm.sbatch: its syntax, its #SBATCH options
# against `sbatch --help` (scripts/deps.sh installs Slurm's client; without it, a printed skip, not a pass), its
# refusals (missing data, no out_dir: one line, status 2, nothing submitted or launched), its
# submission (sbatch called with the script, its options and the programs' paths), and its job body
# (the supervisor over mpirun inside a pretend allocation: SIGUSR1 to the batch shell saves and exits
# 5, the next start of the same job resumes from that step).
# Usage: launch_test.sh <minitrain> <source dir>
set -u
mt=$(realpath "$1")
src=$(realpath "$2")
sbatch_script=$src/scripts/slurm.sbatch
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
fails=0 skips=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
skip() { echo "skip $1"; skips=$((skips + 1)); }
tiny=(data.path=synthetic model.vocab_size=128 model.n_layer=2 model.n_embd=32 model.n_head=4 seq_len=16
      batch_size=2 log_every=100)

if [[ "$("$mt" --version)" == *"MPI on"* ]]; then
  # One node: a rank per slot, each bound to a core of its own, its thread count passed with -x.
  mpirun -np 2 --map-by ppr:2:node:PE=1 --bind-to core --report-bindings -x OMP_NUM_THREADS=1 \
    "$mt" train "${tiny[@]}" steps=2 --tp 2 out_dir="$work/node" >"$work/node.log" 2>&1
  rc=$?
  check "single node: mpirun -np 2 --map-by ppr:2:node:PE=1 --bind-to core trains tp2 (status $rc)" \
    "[[ $rc == 0 ]] && grep -q 'TP(2)-CP(1)-PP(1)-DP(1)' '$work/node.log' && [[ -f '$work/node/model.safetensors' ]]"
  check "single node: each rank bound to a core of its own" \
    "[[ \$(grep -c 'MCW rank [01] bound to' '$work/node.log') == 2 ]]"

  # Several nodes, as a hostfile: here one node, localhost, with 2 slots.
  printf 'localhost slots=2\n' >"$work/hosts"
  mpirun -np 2 --hostfile "$work/hosts" --map-by ppr:2:node --bind-to none -x OMP_NUM_THREADS=1 \
    "$mt" train "${tiny[@]}" steps=2 --pp 2 grad_accum=2 out_dir="$work/hosts_run" >"$work/hosts.log" 2>&1
  rc=$?
  check "hostfile: mpirun --hostfile (localhost slots=2) trains pp2 (status $rc)" \
    "[[ $rc == 0 ]] && grep -q 'PP(2)' '$work/hosts.log' && [[ -f '$work/hosts_run/model.safetensors' ]]"
  printf 'localhost slots=1\n' >"$work/hosts1"
  mpirun -np 2 --hostfile "$work/hosts1" --map-by ppr:2:node --bind-to none "$mt" --version >"$work/hosts1.log" 2>&1
  rc=$?
  check "hostfile: more ranks than its slots is refused by mpirun (status $rc)" "[[ $rc != 0 ]]"
else
  skip "mpirun forms (this build has no MPI)"
fi

# scripts/slurm.sbatch
check "slurm.sbatch: bash -n" "bash -n '$sbatch_script'"
mapfile -t opts < <(sed -n 's/^#SBATCH[[:space:]]\{1,\}\(--[a-z-]*\).*/\1/p' "$sbatch_script")
check "slurm.sbatch: has #SBATCH options (${#opts[@]}), --signal among them" \
  "[[ ${#opts[@]} -ge 5 ]] && grep -q '^#SBATCH --signal=B:USR1@' '$sbatch_script'"
# Slurm reads #SBATCH lines only up to the first command: none may follow one.
first_cmd=$(grep -n -v -E '^(#|[[:space:]]*$)' "$sbatch_script" | head -1 | cut -d: -f1)
last_opt=$(grep -n '^#SBATCH' "$sbatch_script" | tail -1 | cut -d: -f1)
check "slurm.sbatch: every #SBATCH line before the first command" "[[ $last_opt -lt $first_cmd ]]"
if command -v sbatch >/dev/null; then
  # sbatch --help needs a configuration to read, not a cluster: a minimal one.
  printf 'ClusterName=check\nSlurmctldHost=localhost\nNodeName=localhost CPUs=2 State=UNKNOWN\nPartitionName=p Nodes=localhost Default=YES\n' >"$work/slurm.conf"
  SLURM_CONF=$work/slurm.conf sbatch --help >"$work/sbatch_help.txt" 2>&1
  for o in "${opts[@]}"; do
    check "slurm.sbatch: $o is an option of sbatch --help" "grep -qE -- '(^|[ ,])$o(=|\\[| |$)' '$work/sbatch_help.txt'"
  done
  check "sbatch --help check can fail (a made-up option is not found)" \
    "! grep -qE -- '(^|[ ,])--gpus-per-nodes(=|\\[| |$)' '$work/sbatch_help.txt'"
else
  skip "slurm.sbatch: #SBATCH options against sbatch --help (no sbatch here: apt-get install slurm-client)"
fi

# Fake sbatch, srun and scontrol that record their calls: nothing may reach them on a refusal.
mkdir -p "$work/fake" "$work/prefix/bin"
for p in sbatch srun scontrol; do
  printf '#!/usr/bin/env bash\necho "%s $*" >>"%s/calls"\necho "MT_BIN=${MT_BIN:-} MT_SUPERVISE=${MT_SUPERVISE:-}" >>"%s/calls"\n' \
    "$p" "$work" "$work" >"$work/fake/$p"
  chmod +x "$work/fake/$p"
done
ln -s "$mt" "$work/prefix/bin/minitrain"
ln -s "$src/scripts/supervise" "$work/prefix/bin/minitrain-supervise"
fakepath="$work/fake:$work/prefix/bin:$PATH"
refused() {  # NAME EXPECTED-TEXT ARGS...: exit 2, one line naming it, nothing called
  local name=$1 text=$2
  shift 2
  rm -f "$work/calls"
  PATH=$fakepath bash "$sbatch_script" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  check "slurm.sbatch refuses $name: status $rc, one line, nothing submitted" \
    "[[ $rc == 2 && \$(wc -l <'$work/err') == 1 && ! -s '$work/out' && ! -e '$work/calls' ]] && grep -q -- '$text' '$work/err'"
}
refused "a missing data.path" "data.path=$work/nope: no such file" --nodes=1 -- data.path="$work/nope" out_dir="$work/r"
refused "a missing dataset of data.mix" "data.mix=$work/gone: no such" data.mix="$work/gone:0.5,$work/fake:0.5" out_dir="$work/r"
refused "no data at all" "no data" out_dir="$work/r"
refused "no out_dir" "no out_dir" data.path=synthetic
SLURM_JOB_ID=7 refused "a missing data.path inside the job, before srun" "data.path=$work/nope" data.path="$work/nope" out_dir="$work/r"

# Submission: sbatch gets its options, the script and the training options, and the programs' paths.
rm -f "$work/calls"
PATH=$fakepath bash "$sbatch_script" --nodes=1 --time=5 -- data.path=synthetic out_dir="$work/r" steps=3 >/dev/null 2>&1
rc=$?
check "slurm.sbatch submits itself: sbatch --nodes=1 --time=5 <script> <options>, MT_BIN and MT_SUPERVISE passed" \
  "[[ $rc == 0 ]] && grep -qx 'sbatch --nodes=1 --time=5 $sbatch_script data.path=synthetic out_dir=$work/r steps=3' '$work/calls' &&
   grep -q 'MT_BIN=$mt MT_SUPERVISE=$src/scripts/supervise' '$work/calls'"

# The job body in a pretend allocation (2 ranks on this node, mpirun as the launcher; Open MPI told
# not to look for a real Slurm): SIGUSR1 to the batch shell, as --signal=B:USR1 sends it, saves the
# step reached and exits 5; a second start of the same job resumes from it.
if [[ "$("$mt" --version)" == *"MPI on"* ]]; then
  job_env=(SLURM_JOB_ID=4242 SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=2 SLURM_CPUS_PER_TASK=1 MT_LAUNCHER=mpirun
           OMPI_MCA_ras=^slurm OMPI_MCA_plm=^slurm OMPI_MCA_ess=^slurm OMPI_MCA_rmaps_base_oversubscribe=1)
  run=$work/job
  env "${job_env[@]}" PATH="$fakepath" bash "$sbatch_script" "${tiny[@]}" steps=100000 out_dir="$run" \
    >"$work/job.log" 2>&1 &
  job=$!
  # Signalled once training runs (a loaded machine may take long to start 2 ranks); never waited on
  # without a bound: a job that does not end is reported and killed.
  for _ in $(seq 1 1200); do
    grep -q '"step": *[3-9]' "$run/metrics.jsonl" 2>/dev/null && break
    sleep 0.1
  done
  check "job body: training reached step 3 (within 120 s)" "grep -q '\"step\": *[3-9]' '$run/metrics.jsonl'"
  t0=$(date +%s)
  kill -USR1 "$job"
  for _ in $(seq 1 600); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$job" 2>/dev/null; then
    pkill -KILL -f "out_dir=$run" 2>/dev/null
    kill -KILL "$job" 2>/dev/null
  fi
  wait "$job"
  rc=$?
  took=$(($(date +%s) - t0))
  check "job body: ended within 30 s of the signal ($took s)" "[[ $took -lt 30 ]]"
  saved=$(sed -n 's/.*preempted (SIG[A-Z0-9]*): saved step \([0-9]*\).*/\1/p' "$work/job.log" | head -1)
  check "job body: SIGUSR1 to the batch shell saves a step and exits 5 (status $rc, saved step ${saved:-none})" \
    "[[ $rc == 5 && -n '$saved' && -d $(printf '%s/checkpoints/step_%06d' "$run" "${saved:-0}") ]]"
  check "job body: run_id slurm-<job id>, supervised" \
    "grep -q 'run_id=slurm-4242' '$work/job.log' && grep -q 'supervise' '$run/supervise.log'"
  env "${job_env[@]}" PATH="$fakepath" bash "$sbatch_script" "${tiny[@]}" steps=$((${saved:-0} + 2)) out_dir="$run" \
    >"$work/job2.log" 2>&1
  rc=$?
  check "job body: the same job started again resumes from step ${saved:-none} and finishes (status $rc)" \
    "[[ $rc == 0 ]] && grep -q 'resumed from .*(step ${saved:-none})' '$work/job2.log'"
else
  skip "slurm.sbatch job body (this build has no MPI)"
fi

echo "launch_test: $fails failed, $skips skipped"
exit $((fails > 0))
