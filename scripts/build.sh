#!/usr/bin/env bash
# Configures and builds minitrain into build/ (Release, Ninja). Extra arguments go to cmake.
set -euo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
build=${MT_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
