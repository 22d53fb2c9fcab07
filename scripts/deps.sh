#!/usr/bin/env bash
# Installs the Debian packages minitrain builds and tests with, if any are missing.
# Usage: scripts/deps.sh [--with-torch]   (torch: fixtures and the PyTorch peer benchmark)
# slurm-client: only its sbatch, to check scripts/slurm.sbatch's options against it (tests/integration/launch_test.sh).
set -euo pipefail
pkgs=(cmake ninja-build g++ ccache libopenmpi-dev openmpi-bin libopenblas-dev libgtest-dev nlohmann-json3-dev
      libicu-dev python3-numpy python3-matplotlib fortunes fortunes-min slurm-client)
[[ "${1:-}" == "--with-torch" ]] && pkgs+=(python3-torch)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}"
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
