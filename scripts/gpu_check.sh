#!/usr/bin/env bash
# One command for a CUDA machine that has only the CUDA toolkit (nvcc, cuBLAS, maybe NCCL), CMake and a
# C++ compiler: configures a build with what is there, builds minitrain, runs `minitrain selftest
# --device cuda` (every CUDA op against its CPU twin), then the GoogleTest GPU tests when GoogleTest is
# available (the whole trainer on the GPU against the CPU: every precision, recompute mode and attention
# path, ZeRO over NCCL, a checkpoint resumed; the same comparisons the simulated device runs in CI), and
# only then the GPT-2 benchmark at T=1024 in bf16 (flash attention at the largest micro-batch
# of 32/16/8 that fits, then the materialised attention at that size, then gpt2-large if time is
# left); then prints one summary table, last. Finishes within 8 minutes (each step is capped with `timeout`).
#
# What a bare machine lacks comes from .deps/, filled beforehand by scripts/gpu_deps.sh on a machine
# with network access: nlohmann-json and ICU (required) and GoogleTest's sources (optional: without them the
# unit tests are not built). MPI is off (one GPU); without OpenBLAS the CPU reference uses the built-in
# GEMM.
#
# Usage: scripts/gpu_check.sh [--bare] [--no-tests] [--build-dir DIR] [--log FILE]
#   --bare       use nothing from system-wide packages that a bare CUDA machine lacks (nlohmann-json,
#                GoogleTest, OpenBLAS, MPI): only .deps/. Simulates such a machine on a full one.
#   --no-tests   skip the GoogleTest GPU tests.
# The full log goes to FILE, else to $OUT/gpu_check.log when the environment names an output
# directory OUT, else to <build dir>/gpu_check.log. Exit status 0 only if every check passed.
set -uo pipefail
root=$(cd "$(dirname "$(realpath "$0")")/.." && pwd)
build=$root/build-gpu
bare=0
tests=1
log=""
while (($#)); do
  case "$1" in
    --bare) bare=1 ;;
    --no-tests) tests=0 ;;
    --build-dir) build=$(realpath -m "${2:?--build-dir needs a directory}"); shift ;;
    --log) log=$(realpath -m "${2:?--log needs a file}"); shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown flag '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$build"
if [[ -z $log ]]; then
  if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then log=$OUT/gpu_check.log; else log=$build/gpu_check.log; fi
fi
mkdir -p "$(dirname "$log")"
: >"$log"

deadline=$((SECONDS + 470))  # 7 min 50 s for all steps; the table follows at once
jobs=$(nproc)
say() { printf 'gpu_check: %s\n' "$*" | tee -a "$log"; }
# capped <cap seconds> <file> <command...>: runs the command with its output in <file>, then appended
# to the log, capped by both `cap` and the time left; returns its status (124/137: timed out).
capped() {
  local cap=$1 out=$2 left=$((deadline - SECONDS)) rc
  shift 2
  ((cap > left)) && cap=$left
  printf '\n$ %s\n' "$*" >>"$log"
  if ((cap < 5)); then
    echo "(not started: out of time)" | tee -a "$log" >"$out"
    return 124
  fi
  local t=$SECONDS
  timeout -k 5 "$cap" "$@" >"$out" 2>&1
  rc=$?
  cat "$out" >>"$log"
  if ((rc == 124 || rc == 137)); then
    echo "(timed out after $cap s)" >>"$log"
  else
    echo "(exit status $rc after $((SECONDS - t)) s)" >>"$log"
  fi
  return $rc
}
logged() {
  local cap=$1
  shift
  capped "$cap" "$build/step.out" "$@"
}
# Last non-empty line of a file, for one-line failure reasons.
last_line() { grep -v '^[[:space:]]*$' "$1" 2>/dev/null | tail -n 1 | cut -c1-140; }
# The value column of a `minitrain bench` table row.
bench_value() { grep -m1 "^| $1 " "$2" | awk -F'|' '{gsub(/^ +| +$/, "", $3); print $3}'; }

say "log: $log"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(uname -srm), $jobs cores"
  if rev=$(git -C "$root" rev-parse --short HEAD 2>/dev/null); then
    echo "git: $rev$(git -C "$root" diff --quiet HEAD || echo ' with local changes')"
  fi
  echo "cmake: $(cmake --version 2>/dev/null | head -n 1)"
  echo "nvcc: $( (command -v nvcc || ls /usr/local/cuda/bin/nvcc) 2>/dev/null | head -n 1) $( (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | grep -m1 release)"
} >>"$log"
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
[[ -z $gpu ]] && gpu="none found (nvidia-smi: $(command -v nvidia-smi >/dev/null && echo 'no device' || echo 'not installed'))"
echo "gpu: $gpu" >>"$log"

# ---- dependencies: the system's where present (unless --bare), else .deps/ ----
deps=$root/.deps/usr
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DMT_CUDA=AUTO -DMT_MPI=OFF)
((bare)) && cmake_args+=(-DMT_BLAS=OFF)
have_system() { ((bare == 0)) && compgen -G "$1" >/dev/null; }
json_from=missing
if have_system "/usr/include/nlohmann/json.hpp" || have_system "/usr/local/include/nlohmann/json.hpp"; then
  json_from=system
elif [[ -f $deps/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake ]]; then
  json_from=.deps
  cmake_args+=(-Dnlohmann_json_DIR="$deps/share/cmake/nlohmann_json")
fi
icu_from=missing
if have_system "/usr/include/unicode/uchar.h" || have_system "/usr/local/include/unicode/uchar.h"; then
  icu_from=system
elif [[ -f $deps/include/unicode/uchar.h ]]; then
  icu_from=.deps  # the libraries' directory goes into the build tree's rpath
  cmake_args+=(-DICU_ROOT="$deps" -DICU_INCLUDE_DIR="$deps/include")
fi
gtest_from=none
if ((tests)); then
  if have_system "/usr/lib/*/cmake/GTest/GTestConfig.cmake" || have_system "/usr/lib/cmake/GTest/GTestConfig.cmake" ||
     have_system "/usr/local/lib*/cmake/GTest/GTestConfig.cmake"; then
    gtest_from=system
  elif [[ -f $deps/src/googletest/CMakeLists.txt ]]; then
    # Built from the packaged sources with this machine's compiler; the packaged static libraries
    # (libgtest-dev) are the fallback.
    say "building GoogleTest from .deps/ sources"
    gt=$build/_deps/googletest
    if logged 150 cmake -S "$deps/src/googletest" -B "$gt/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
         -DINSTALL_GTEST=ON -DCMAKE_INSTALL_PREFIX="$gt/install" -DCMAKE_INSTALL_LIBDIR=lib \
         -DCMAKE_POLICY_VERSION_MINIMUM=3.5 &&
       logged 150 cmake --build "$gt/build" -j "$jobs" && logged 30 cmake --install "$gt/build"; then
      gtest_from=".deps (built from source)"
      cmake_args+=(-DGTest_DIR="$gt/install/lib/cmake/GTest")
    elif compgen -G "$deps/lib/*/cmake/GTest/GTestConfig.cmake" >/dev/null; then
      gtest_from=".deps (packaged libraries)"
      cmake_args+=(-DGTest_DIR="$(dirname "$(compgen -G "$deps/lib/*/cmake/GTest/GTestConfig.cmake" | head -n 1)")")
    fi
  fi
fi
want_tests=$tests
[[ $gtest_from == none ]] && tests=0
cmake_args+=("-DMT_BUILD_TESTS=$([[ $tests == 1 ]] && echo ON || echo OFF)")
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [[ -f $build/CMakeCache.txt ]] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${gen[1]:-Unix Makefiles}\$" "$build/CMakeCache.txt"; then
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"  # made by another generator
fi

# ---- configure and build ----
build_row="not run"
cuda_on=unknown
say "configuring (nlohmann-json: $json_from, ICU: $icu_from, GoogleTest: $gtest_from)"
t0=$SECONDS
if [[ $json_from == missing ]]; then
  build_row="not run: nlohmann-json missing; run scripts/gpu_deps.sh where the network is reachable and copy .deps/"
elif ! logged 120 cmake -S "$root" -B "$build" "${gen[@]}" "${cmake_args[@]}"; then
  build_row="configure failed: $(grep -m1 -A2 "CMake Error" "$build/step.out" | tr -s " \n" " " | cut -c1-160)"
else
  cuda_on=$(grep -o 'minitrain: CUDA = [A-Z]*' "$build/step.out" | tail -n 1 | awk '{print $4}')
  blas=$(grep -o 'minitrain: \(BLAS = .*\|no OpenBLAS.*\)' "$build/step.out" | tail -n 1 | sed 's/minitrain: //')
  targets=(minitrain)
  if ((tests)) && [[ $cuda_on == ON ]]; then
    for t in "$root"/tests/test_cuda_*.cpp; do targets+=("$(basename "$t" .cpp)"); done
  fi
  say "building ${targets[*]} with -j $jobs"
  # All the time left but a minute for the selftest and the benchmark.
  if logged $((deadline - SECONDS - 60)) cmake --build "$build" -j "$jobs" --target "${targets[@]}"; then
    build_row="ok in $((SECONDS - t0)) s (CUDA $cuda_on, ${blas:-BLAS ?}, MPI off, tests $([[ $tests == 1 ]] && echo on || echo off))"
  else
    rc=$?
    [[ $rc == 124 || $rc == 137 ]] && build_row="timed out after $((SECONDS - t0)) s" || build_row="failed: $(grep -m1 -E 'error|FAILED' "$build/step.out" | cut -c1-140)"
  fi
fi
bin=$build/minitrain
built=0
[[ $build_row == ok* ]] && built=1

# ---- selftest: every CUDA op against its CPU twin ----
ops_row="not run (no build)"
device=unknown
if ((built)); then
  say "running minitrain selftest --device cuda"
  capped 150 "$build/selftest.out" "$bin" selftest --device cuda
  rc=$?
  summary=$(grep -m1 '^selftest summary:' "$build/selftest.out")
  if [[ -n $summary ]]; then
    device=yes
    passed=$(sed -n 's/.*passed=\([0-9]*\).*/\1/p' <<<"$summary")
    failed=$(sed -n 's/.*failed=\([0-9]*\).*/\1/p' <<<"$summary")
    maxerr=$(sed -n 's/.*max_rel_err=\([^ ]*\).*/\1/p' <<<"$summary")
    worst=$(sed -n 's/.*worst=\(.*\) err\/tol=\(.*\)$/\1, err\/tol \2/p' <<<"$summary")
    ops_row="$((passed + failed)) compared: $passed passed, $failed failed; max rel err $maxerr (worst: $worst)"
    [[ $rc != 0 && $failed == 0 ]] && ops_row="$ops_row; exit status $rc"
  elif grep -q "no CUDA device found" "$build/selftest.out"; then
    device=no
    ops_row="FAILED: no CUDA device found (cudaGetDeviceCount returned 0)"
  elif grep -q "no CUDA backend" "$build/selftest.out"; then
    device=no
    ops_row="FAILED: this build has no CUDA backend (nvcc not found?)"
  elif grep -q "unknown command 'selftest'" "$build/selftest.out"; then
    ops_row="not run: this minitrain has no selftest command yet"
  elif [[ $rc == 124 || $rc == 137 ]]; then
    ops_row="FAILED: timed out; last line: $(last_line "$build/selftest.out")"
  else
    ops_row="FAILED (exit $rc): $(last_line "$build/selftest.out")"
  fi
  say "selftest: $ops_row"
  # The tensor-core flash kernels are the newest code here: if the selftest finds them (or the
  # fragment probe they stand on) wrong, the benchmarks still run, on the SIMT flash kernels
  # (MT_FLASH_SIMT=1), and the table says so.
  if grep -E '^\| (tensor_core_fragments |flash_attention_(fwd|bwd) .*tensor cores)' "$build/selftest.out" |
       grep -qE '\| FAIL +\|'; then
    export MT_FLASH_SIMT=1
    flash_note="tensor-core flash kernels FAILED the selftest; benchmarks ran with MT_FLASH_SIMT=1 (SIMT kernels)"
    say "$flash_note"
  fi
fi

# ---- GoogleTest GPU tests first (label gpu): the whole trainer against the CPU, then the figures ----
tests_row="not run (no build)"
((tests)) || tests_row="not run (no GoogleTest here or in .deps/: run scripts/gpu_deps.sh)"
((want_tests)) || tests_row="not run (--no-tests)"
if ((built && tests)) && [[ $cuda_on == ON ]]; then
  say "running the GPU unit tests (ctest -L gpu)"
  capped 150 "$build/ctest.out" ctest --test-dir "$build" -L gpu -j 4 --timeout 120 --output-on-failure
  rc=$?
  line=$(grep -m1 'tests passed' "$build/ctest.out")
  if [[ -n $line ]]; then
    skipped=$(grep -c ' (Skipped)$' "$build/ctest.out")
    tests_row="$line (skipped: $skipped)"
  else
    tests_row="FAILED (exit $rc): $(last_line "$build/ctest.out")"
  fi
  say "tests: $tests_row"
elif ((tests)) && [[ $cuda_on != ON ]]; then
  tests_row="not run (no CUDA backend in this build)"
fi

# ---- benchmark: GPT-2 (124M), T=1024, bf16 ----
# Flash attention at the largest micro-batch that fits (tried from the top; an out-of-memory start
# fails fast), then the materialised attention path at the same size for comparison.
bench_row="not run (no build)"
flash_note=${flash_note:-"tensor cores (bf16, head size 64)"}
tok_s="not run" mfu="not run" hfu="not run" peak_mem="not run" mat_row="not run" large_row="not run"
profile_row="not run" plan_row="not run" torch_row="not run" torch_compile_row="not run"
run_bench() {  # run_bench <out file> <batch> <attention> [model]
  capped 100 "$1" "$bin" bench model="${4:-gpt2}" seq_len=1024 batch_size="$2" precision=bf16 device=cuda \
    attention="$3" steps=10 warmup=3
}
if ((built)); then
  bench_b=0
  for b in 32 16 8; do
    say "running minitrain bench (gpt2, B=$b T=1024, bf16, flash attention, device cuda)"
    run_bench "$build/bench.out" "$b" flash
    rc=$?
    if [[ $rc == 0 ]] && grep -q '^| tokens/s' "$build/bench.out"; then
      bench_b=$b
      break
    fi
    grep -qi 'out of memory' "$build/bench.out" || break  # another failure: do not retry smaller
  done
  if ((bench_b)); then
    bench_row="ok: $(bench_value config "$build/bench.out")"
    tok_s=$(bench_value 'tokens/s \(median\)' "$build/bench.out")
    mfu="$(bench_value MFU "$build/bench.out") of $(bench_value peak "$build/bench.out")"
    hfu=$(bench_value HFU "$build/bench.out")
    peak_mem="$(bench_value 'peak mem total' "$build/bench.out") (arena); device: $(bench_value 'device mem in use' "$build/bench.out")"
    say "running minitrain bench (gpt2, B=$bench_b T=1024, bf16, materialized attention)"
    if run_bench "$build/bench_mat.out" "$bench_b" materialized && grep -q '^| tokens/s' "$build/bench_mat.out"; then
      mat_row="$(bench_value 'tokens/s \(median\)' "$build/bench_mat.out") tokens/s, MFU $(bench_value MFU "$build/bench_mat.out")"
    else
      mat_row="FAILED: $(last_line "$build/bench_mat.out")"
    fi
    # Where the time goes: the same run with every op timed by CUDA events (its tokens/s are not quoted).
    say "running minitrain bench (gpt2, B=$bench_b, flash, profile_ops=1)"
    if capped 60 "$build/profile.out" "$bin" bench model=gpt2 seq_len=1024 batch_size="$bench_b" precision=bf16 \
         device=cuda attention=flash steps=2 warmup=1 profile_ops=1 && grep -q '^| op (profile_ops=1)' "$build/profile.out"; then
      profile_row=$(sed -n '/^| op (profile_ops=1)/,$p' "$build/profile.out" | sed -n '3,5p' |
        awk -F' *[|] *' '{printf "%s%s %s (%s, %s of roofline)", (NR > 1 ? ", " : ""), $2, $5, $6, $8}')
    else
      profile_row="FAILED: $(last_line "$build/profile.out")"
    fi
    # The planner against the measured step: the GPU calibrated (bench --calibrate device=cuda), then
    # the plan's predicted ms/step for the same run with that file and with the h200 datasheet entry.
    say "running minitrain bench --calibrate device=cuda, then plan for the same run"
    ms_measured=$(bench_value 'ms/step \(median\)' "$build/bench.out")
    plan_ms() {  # plan_ms <hw>: the plan's predicted ms/step for the benchmarked run
      "$bin" plan model=gpt2 seq_len=1024 batch_size="$bench_b" precision=bf16 attention=flash hw="$1" --json 2>&1 |
        /usr/bin/env python3 -c 'import json, sys; print("%.1f" % (1e3 * json.load(sys.stdin)["time"]["step_s"]))' 2>/dev/null
    }
    if capped 60 "$build/calibrate.out" "$bin" bench --calibrate device=cuda out="$build/gpu-calibrated.json"; then
      plan_row="measured $ms_measured ms/step; predicted $(plan_ms "$build/gpu-calibrated.json") (calibrated: $(tail -n 1 "$build/calibrate.out" | sed 's/.*per rank: //; s/)$//')), $(plan_ms h200) (h200 datasheet)"
    else
      plan_row="calibration FAILED: $(last_line "$build/calibrate.out"); predicted $(plan_ms h200) ms/step (h200 datasheet) vs measured $ms_measured"
    fi
    # The PyTorch peer on the same run (GPT-2, B, T=1024, bf16 autocast, SDPA attention): eager, then
    # torch.compile while at least three minutes are left (its compilation runs in the untimed warm-up).
    torch_peer() {  # torch_peer <out file> <cap> [--compile]
      capped "$2" "$1" python3 "$root/scripts/bench_torch.py" --preset gpt2 --device cuda --precision bf16 \
        --batch "$bench_b" --seq 1024 --steps 10 --warmup 3 "${@:3}"
    }
    peer_line() { grep -m1 '^result: ' "$1" | sed 's/^result: //'; }
    if python3 -c 'import torch' 2>/dev/null; then
      say "running the PyTorch peer (gpt2, B=$bench_b T=1024, bf16 autocast, SDPA, eager)"
      torch_peer "$build/torch_eager.out" 90 && torch_row="$(peer_line "$build/torch_eager.out")" ||
        torch_row="FAILED: $(last_line "$build/torch_eager.out")"
      if ((deadline - SECONDS > 180)); then
        say "running the PyTorch peer with torch.compile"
        torch_peer "$build/torch_compile.out" 150 --compile && torch_compile_row="$(peer_line "$build/torch_compile.out")" ||
          torch_compile_row="FAILED or timed out: $(last_line "$build/torch_compile.out")"
      else
        torch_compile_row="not run: out of time"
      fi
    else
      torch_row="not run: no PyTorch (python3 -c 'import torch' fails)"
    fi
    # gpt2-large (774M, the issue's second bar) while at least two minutes are left.
    if ((deadline - SECONDS > 120)); then
      say "running minitrain bench (gpt2-large, B=8 T=1024, bf16, flash attention)"
      if run_bench "$build/bench_large.out" 8 flash gpt2-large && grep -q '^| tokens/s' "$build/bench_large.out"; then
        large_row="B=8: $(bench_value 'tokens/s \(median\)' "$build/bench_large.out") tokens/s, MFU $(bench_value MFU "$build/bench_large.out"), HFU $(bench_value HFU "$build/bench_large.out")"
      else
        large_row="FAILED: $(last_line "$build/bench_large.out")"
      fi
    else
      large_row="not run: out of time"
    fi
  elif [[ $device == no ]]; then
    bench_row="not run: no CUDA device"
  elif [[ $rc == 124 || $rc == 137 ]]; then
    bench_row="FAILED: timed out"
  else
    bench_row="FAILED (exit $rc): $(last_line "$build/bench.out")"
  fi
  say "bench: $bench_row"
fi

# ---- the summary table ----
status=0
[[ $ops_row == *" 0 failed;"* ]] || status=1
[[ $tests_row == FAILED* || ($tests_row == *"tests failed out of"* && $tests_row != *" 0 tests failed"*) ]] && status=1
table() {
  if [[ -f $build/profile.out ]] && grep -q '^| op (profile_ops=1)' "$build/profile.out"; then
    printf '\nPer-op device time (gpt2, B=%s, bf16, flash; CUDA events):\n' "$bench_b"
    sed -n '/^| op (profile_ops=1)/,$p' "$build/profile.out"
  fi
  printf '\n| %-24s | %s |\n' "minitrain gpu_check" "result"
  printf '|--------------------------|--------|\n'
  printf '| %-24s | %s |\n' "GPU" "$gpu"
  printf '| %-24s | %s |\n' "build" "$build_row"
  printf '| %-24s | %s |\n' "ops vs CPU (selftest)" "$ops_row"
  printf '| %-24s | %s |\n' "GPU unit tests" "$tests_row"
  printf '| %-24s | %s |\n' "flash attention kernels" "$flash_note"
  printf '| %-24s | %s |\n' "bench gpt2 T=1024 bf16" "$bench_row"
  printf '| %-24s | %s |\n' "tokens/s" "$tok_s"
  printf '| %-24s | %s |\n' "MFU" "$mfu"
  printf '| %-24s | %s |\n' "HFU" "$hfu"
  printf '| %-24s | %s |\n' "peak memory" "$peak_mem"
  printf '| %-24s | %s |\n' "materialized attention" "$mat_row"
  printf '| %-24s | %s |\n' "top ops (share, rate)" "$profile_row"
  printf '| %-24s | %s |\n' "PyTorch peer (same run)" "$torch_row"
  printf '| %-24s | %s |\n' "PyTorch torch.compile" "$torch_compile_row"
  printf '| %-24s | %s |\n' "plan vs measured step" "$plan_row"
  printf '| %-24s | %s |\n' "gpt2-large T=1024 bf16" "$large_row"
  local warnings
  warnings=$(cat "$build"/bench*.out 2>/dev/null | grep -m2 'warning:' | cut -c1-150 | tr '\n' ' ')
  printf '| %-24s | %s |\n' "warnings (bench)" "${warnings:-none}"
  printf '| %-24s | %s |\n' "total time" "$((SECONDS - deadline + 470)) s; log: $log"
}
table | tee -a "$log"
exit $status
