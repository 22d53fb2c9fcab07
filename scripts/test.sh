#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds (CUDA targets too when nvcc is present,
# so CUDA code is compiled and linked even without a GPU), and runs every ctest entry.
# GPU-labelled tests report as skipped without a device. Extra arguments go to ctest (e.g. -R mpi_).
# MT_QUICK=1 installs and builds, then lists the tests instead of running them (the README's test
# runs this command from inside the suite); MT_BUILD_DIR names the build directory (default build/).
# Where the CUDA toolkit's headers are, the simulated device (sim/, MT_CUDA_SIM=ON) builds in a second
# directory (build-sim/, or MT_SIM_BUILD_DIR) and its tests run after the suite: the tests labelled
# `sim`, the CUDA backend whole on the CPU against the CPU backend.
set -euo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
"$root/scripts/deps.sh"
"$root/scripts/build.sh"
build=${MT_BUILD_DIR:-$root/build}
cd "$build"
if [[ "${MT_QUICK:-0}" == 1 ]]; then
  ctest -N "$@"
else
  ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@"
fi
if [[ "${MT_QUICK:-0}" != 1 && $# -eq 0 && -f /usr/local/cuda/include/cuda_runtime_api.h ]]; then
  sim=${MT_SIM_BUILD_DIR:-$root/build-sim}
  MT_BUILD_DIR=$sim MT_BUILD_TARGET=sim_tests "$root/scripts/build.sh" -DMT_CUDA=OFF -DMT_CUDA_SIM=ON
  (cd "$sim" && ctest --output-on-failure -j "$(nproc)" --timeout 600 -L sim)
fi
