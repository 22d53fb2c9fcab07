#!/usr/bin/env bash
# Configures and builds minitrain into build/ (Release, Ninja). Extra arguments go to cmake's configure;
# MT_BUILD_DIR names another build directory, MT_BUILD_TARGET builds one target instead of all.
# Compiles through ccache where it is installed (scripts/deps.sh installs it; MT_CCACHE=0 turns it off):
# the simulated-device build that scripts/test.sh makes next then reuses every object whose
# preprocessed source is the same as here, all but the few files that read the device defines.
set -euo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
build=${MT_BUILD_DIR:-$root/build}
launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=)
if [[ "${MT_CCACHE:-1}" != 0 ]] && command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # The cache lives beside the build directories (ignored by git) unless CCACHE_DIR says otherwise.
  export CCACHE_DIR=${CCACHE_DIR:-$root/build-ccache} CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-4G}
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)" ${MT_BUILD_TARGET:+--target "$MT_BUILD_TARGET"}
