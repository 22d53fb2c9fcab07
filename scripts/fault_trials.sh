#!/usr/bin/env bash
# A seeded fault campaign on a 4-rank tiny run: kills (a random rank SIGKILLed at a random phase and
# step, then resumed by scripts/supervise), ENOSPC on a checkpoint write, one random byte of a random
# checkpoint file changed before a resume, divergence, a hung rank (SIGSTOP: exit 4 after
# dist.timeout, relaunched), a straggler (named in metrics.jsonl) and a preemption (SIGTERM: the step
# reached saved, exit 5, relaunched). Each trial is judged against the
# uninterrupted run: recovered bitwise, refused with a correct error, or anything else; a table per
# kind is printed at the end, and the exit status is 1 if anything else happened
# (tests/integration/fault_campaign.sh says what each kind expects).
# Usage: scripts/fault_trials.sh [--trials N] [--seed S] [--keep DIR]   (default 4 trials, seed from the clock)
#        scripts/fault_trials.sh --kills-only N [seed] [--np R layout flags...]   kill and ENOSPC trials only
#          (tests/integration/fault_test.sh), e.g. on all four dimensions:
#          scripts/fault_trials.sh --kills-only 10 7 --np 16 --tp 2 --cp 2 --pp 2 data.doc_mask=true
set -euo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
"$root/scripts/deps.sh"
"$root/scripts/build.sh"
mt="${MT_BUILD_DIR:-$root/build}/minitrain"
if [[ ${1:-} == --kills-only ]]; then
  exec bash "$root/tests/integration/fault_test.sh" "$mt" "$root/scripts/supervise" "${2:-10}" "${3:-$(date +%s)}" \
    "${@:4}"
fi
exec bash "$root/tests/integration/fault_campaign.sh" "$mt" "$root/scripts/supervise" "$@"
