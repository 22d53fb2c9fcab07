#!/usr/bin/env bash
# One failure, one line, whatever the timing: a failure that several ranks raise is printed once.
#  1. A replica check that fails (a bit flipped on rank 1 after a checkpoint was saved) while rank 0's
#     writer is stalled in the middle of that save (ckpt.fault_phase=slow_write: a slow disk): rank 0
#     reports it, in one line, before anything waits for the writer; rank 1, which raised the same
#     error, stays silent. Nothing is said about the save of step 4 (a save that committed is
#     complete; one that did not is left unfinished, and the error that ended the job is the one
#     reported).
#  2. ENOSPC on every rank's write of the same save (ckpt.fault_rank=-1: one disk under all of them
#     filling up), on 4 ranks: one line, from the lowest rank whose own write failed (rank 0).
# Usage: one_error_test.sh <minitrain binary>
set -u
mt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
tiny=(model=tiny model.vocab_size=64 model.n_layer=1 model.n_embd=32 model.n_head=4 model.block_size=32 seq_len=32
      batch_size=2 data.path=synthetic threads=1)
mpi=(/usr/bin/mpiexec --oversubscribe --mca btl self,vader --mca pml ob1)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
error_lines() { grep 'error:\|^\[error' "$1"; }  # the launcher's lines and the loggers' error lines
# one_error_line <description> <exit status> <pattern>: the run exited 1 and $work/err holds exactly
# one error line, which matches the pattern.
one_error_line() {
  if [[ $2 -eq 1 && $(error_lines "$work/err" | wc -l) -eq 1 ]] && grep -q "$3" "$work/err"; then
    pass "$1"
  else
    fail "$1 (rc=$2: $(error_lines "$work/err"))"
  fi
}

timeout 60 "${mpi[@]}" -n 2 "$mt" train "${tiny[@]}" steps=8 save_every=4 sdc_every=2 parallel.sdc_flip_step=6 \
  parallel.sdc_flip_rank=1 ckpt.fault_phase=slow_write ckpt.fault_step=4 ckpt.fault_rank=0 out_dir="$work/sdc" \
  >/dev/null 2>"$work/err"
one_error_line "replica mismatch, rank 0's writer stalled: one error line, from rank 0" $? \
  '^minitrain: error: silent data corruption check failed after step 6: the parameters of data-parallel rank 1'
if grep -q 'failed\|cancelled' <(grep -v 'silent data corruption check failed' "$work/err"); then
  fail "no save reported failed or cancelled ($(grep 'failed\|cancelled' "$work/err"))"
else
  pass "no save reported failed or cancelled"
fi
# Whatever became of the save of step 4, no step_000004.tmp is taken for a checkpoint, and a
# step_000004, if committed, verifies.
if [[ ! -e "$work/sdc/checkpoints/step_000004" ]] || "$mt" ckpt verify "$work/sdc/checkpoints/step_000004" >/dev/null 2>&1; then
  pass "the save of step 4, if committed, verifies"
else
  fail "the save of step 4, if committed, verifies"
fi

timeout 60 "${mpi[@]}" -n 4 "$mt" train "${tiny[@]}" steps=8 save_every=4 ckpt.fault_phase=enospc ckpt.fault_step=4 \
  ckpt.fault_rank=-1 out_dir="$work/full" >/dev/null 2>"$work/err"
one_error_line "ENOSPC on every rank: one error line, from rank 0" $? \
  '^minitrain: \[rank 0\] error: checkpoint save of step 4 .* failed on rank 0: .*No space left on device'
if [[ ! -e "$work/full/checkpoints/step_000004" && ! -e "$work/full/checkpoints/step_000004.tmp" ]]; then
  pass "the failed save left no step_000004 and no step_000004.tmp"
else
  fail "the failed save left no step_000004 and no step_000004.tmp ($(ls "$work/full/checkpoints"))"
fi

[[ $fails -eq 0 ]] && echo "all one-error checks passed"
exit $((fails > 0))
