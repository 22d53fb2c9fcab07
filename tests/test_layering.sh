#!/usr/bin/env bash
# The layering of the rooms, read from the sources' includes: a folder may include only itself and the
# folders below it in
#   runtime < kernels < parallel < moe < model < {data, checkpoint} < config < plan < train < cli
# (data and checkpoint side by side: neither includes the other). Every `#include "room/..."` in a
# room's sources that points up the order, or sideways, is printed as file:line and fails the test.
# Usage: test_layering.sh ROOT      checks the tree at ROOT
#        test_layering.sh --self    first proves the check can fail (a planted upward include), then
#                                   checks the project's own tree
set -uo pipefail
order=(runtime kernels parallel moe model data checkpoint config plan train cli)
declare -A level=([runtime]=0 [kernels]=1 [parallel]=2 [moe]=3 [model]=4 [data]=5 [checkpoint]=5 [config]=6
                  [plan]=7 [train]=8 [cli]=9)

check_tree() {
  local root=$1 bad=0 room file line target
  for room in "${order[@]}"; do
    [[ -d "$root/$room" ]] || continue
    while IFS=: read -r file line target; do
      target=${target#*\"}
      target=${target%%/*}
      [[ -n "${level[$target]+x}" && "$target" != "$room" ]] || continue
      if (( level[$target] >= level[$room] )); then
        echo "${file#"$root"/}:$line includes $target/: $room may include only the rooms below it (${order[*]})"
        bad=1
      fi
    done < <(grep -rn --include='*.h' --include='*.cpp' --include='*.cc' --include='*.cu' --include='*.cuh' \
                  --include='*.in' -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[a-z_]+/' "$root/$room")
  done
  return $bad
}

here=$(cd "$(dirname "$0")/.." && pwd)
if [[ "${1:-}" == "--self" ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/plan" "$tmp/train" "$tmp/data"
  echo '#include "train/trainer.h"' > "$tmp/plan/x.cpp"
  echo '#include "config/options.h"' > "$tmp/train/y.cpp"
  if check_tree "$tmp" > "$tmp/out"; then
    echo "layering: the check passed a tree where plan/ includes train/"; exit 1
  fi
  grep -q '^plan/x.cpp:1 includes train/' "$tmp/out" || { echo "layering: the planted include was not named:"; cat "$tmp/out"; exit 1; }
  grep -q '^train/' "$tmp/out" && { echo "layering: a downward include was refused:"; cat "$tmp/out"; exit 1; }
  echo '#include "checkpoint/format.h"' > "$tmp/data/z.cpp"
  rm "$tmp/plan/x.cpp"
  check_tree "$tmp" > "$tmp/out" && { echo "layering: data/ including its sibling checkpoint/ passed"; exit 1; }
  root=$here
else
  root=${1:?usage: test_layering.sh ROOT | --self}
fi
check_tree "$root" || exit 1
echo "layering: every include of ${order[*]} points down the order"
