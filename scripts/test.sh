#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (CUDA targets too when nvcc is present,
# so CUDA code is compiled and linked even without a GPU), and runs every ctest entry.
# GPU-labelled tests report as skipped without a device.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh"
"$root/scripts/build.sh"
build=${MT_BUILD_DIR:-$root/build}
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@"
