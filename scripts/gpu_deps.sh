#!/usr/bin/env bash
# Fetches the Debian packages that a bare CUDA machine lacks and unpacks them into .deps/ (ignored by
# git), so that .deps/ can travel with the source tree to a machine without network access:
#   nlohmann-json3-dev         the JSON headers every build needs
#   libicu-dev, libicu72       ICU's character properties, the pre-tokenizer's Unicode classes
#   googletest, libgtest-dev   GoogleTest sources and headers, for the GPU unit tests (skip: --no-tests)
# Nothing is installed system-wide and no source enters the repository. scripts/gpu_check.sh uses
# .deps/ for whatever the system itself does not provide.
# Run it where Debian's archive is reachable: scripts/gpu_deps.sh [--no-tests]
set -euo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
deps=$root/.deps

pkgs=(nlohmann-json3-dev libicu-dev libicu72)
case "${1:-}" in
  "") pkgs+=(googletest libgtest-dev) ;;
  --no-tests) ;;
  *) echo "usage: scripts/gpu_deps.sh [--no-tests]" >&2; exit 2 ;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"  # apt downloads as its own unprivileged user when it can
download() { (cd "$tmp" && apt-get download -q "${pkgs[@]}"); }
if ! download; then
  echo "gpu_deps: download failed; refreshing the package lists and trying once more" >&2
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  download
fi

rm -rf "$deps"
mkdir -p "$deps"
for deb in "$tmp"/*.deb; do
  dpkg-deb -x "$deb" "$deps"
  basename "$deb" >>"$deps/PACKAGES"
done
rm -rf "$deps/usr/share/doc"  # copyright notices stay in the .deb; the tree only needs headers and sources
echo "gpu_deps: unpacked into $deps ($(du -sh "$deps" | cut -f1)):"
sed 's/^/  /' "$deps/PACKAGES"
