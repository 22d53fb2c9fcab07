#!/usr/bin/env bash
# Runs every ```sh block of a markdown file, in order, in one scratch directory, with the minitrain
# under test first on PATH as `minitrain`; a block that exits non-zero fails the test, naming the
# block's first line in the file. Blocks fenced otherwise (```text ...) are not run; blocks that call
# mpirun are skipped (said so) when the binary was built without MPI. The repository's scripts/ is
# reachable from the scratch directory, and MT_QUICK=1 (the docs' toy-size switch), MT_WORK_DIR (the
# scratch directory) and MT_BUILD_DIR (the binary's build directory) are set for them, so
# `scripts/train.sh` runs a short job into the scratch directory and `scripts/test.sh` lists the suite.
# Usage: doc_test.sh <minitrain binary> <file.md>
set -u
mt=$(realpath "$1")
doc=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin" "$work/run"
ln -s "$mt" "$work/bin/minitrain"
ln -s "$(cd "$(dirname "$(realpath "$0")")/../.." && pwd)/scripts" "$work/run/scripts"
export PATH="$work/bin:$PATH" OMP_NUM_THREADS=1
export MT_QUICK=1 MT_WORK_DIR="$work/run" MT_BUILD_DIR="$(dirname "$mt")"
# Open MPI as the tests run it (shared memory only; as root in CI containers).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
mpi=1
[[ "$("$mt" --version)" == *"MPI on"* ]] || mpi=0

fails=0 blocks=0 in=0 start=0 body=""
lineno=0
while IFS= read -r line || [[ -n "$line" ]]; do
  lineno=$((lineno + 1))
  if (( in )); then
    if [[ "$line" == '```' ]]; then
      in=0 blocks=$((blocks + 1))
      if [[ $mpi == 0 && "$body" == *mpirun* ]]; then
        echo "skip block at $(basename "$doc"):$start (this build has no MPI)"
      elif (cd "$work/run" && bash -euo pipefail -c "$body") < /dev/null > "$work/out" 2>&1; then
        echo "ok   block at $(basename "$doc"):$start"
      else
        echo "FAIL block at $(basename "$doc"):$start"; sed 's/^/     /' "$work/out" | tail -20
        fails=$((fails + 1))
      fi
    else
      body+="$line"$'\n'
    fi
  elif [[ "$line" == '```sh' ]]; then
    in=1 start=$((lineno + 1)) body=""
  fi
done < "$doc"
(( in )) && { echo "FAIL unclosed block at line $start"; fails=$((fails + 1)); }
expected=$(grep -c '^```sh$' "$doc")
(( blocks == expected )) || { echo "FAIL ran $blocks of $expected sh blocks (one read the file's stdin?)"; fails=$((fails + 1)); }
(( blocks > 0 )) || { echo "FAIL no sh blocks in $doc"; fails=$((fails + 1)); }
exit $((fails > 0))
