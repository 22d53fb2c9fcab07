#!/usr/bin/env bash
# Seeded randomized kill-and-resume trials: N runs of 4 ranks, each SIGKILLed (or failing a
# checkpoint write) at a random phase, rank and step, relaunched by scripts/supervise; every final
# state must equal the uninterrupted run's bit for bit. Prints "N/N identical" at the end.
# Usage: scripts/fault_trials.sh [N] [seed]   (default 10 trials, seed from the clock)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-10}
seed=${2:-$(date +%s)}
"$root/scripts/deps.sh"
"$root/scripts/build.sh"
exec bash "$root/tests/integration/fault_test.sh" "${MT_BUILD_DIR:-$root/build}/minitrain" "$root/scripts/supervise" "$n" "$seed"
