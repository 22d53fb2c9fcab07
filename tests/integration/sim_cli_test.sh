#!/usr/bin/env bash
# The commands a user runs first on a GPU, run whole on the simulated device (a build with
# MT_CUDA_SIM=ON): `minitrain --version` says the device is simulated, `selftest` passes its checks,
# `bench device=cuda` completes and names the simulated device (and with --dp 2 times the device's
# gradient communication), and `bench --calibrate device=cuda` writes a hardware file the planner reads.
# Usage: sim_cli_test.sh <minitrain>
set -euo pipefail
mt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$mt" --version | grep -q "CUDA simulated" || fail "--version does not say the device is simulated"

# A few ops only: every op at every shape is the sim suite's CudaSelftest cases (tests/test_cuda_ops.cpp).
"$mt" selftest --op add,scale,layernorm_fwd,adamw >"$work/selftest.txt" 2>&1 || { tail -20 "$work/selftest.txt"; fail "selftest"; }
grep -q "failed=0" "$work/selftest.txt" || fail "selftest summary: $(tail -1 "$work/selftest.txt")"
echo "ok   selftest: $(grep 'selftest summary' "$work/selftest.txt")"

(cd "$work" && "$mt" bench device=cuda steps=2 warmup=1 batch_size=2 seq_len=32 model.n_layer=2 \
  model.n_embd=64 >"$work/bench.txt" 2>&1) || { tail -20 "$work/bench.txt"; fail "bench device=cuda"; }
grep -q "tokens/s" "$work/bench.txt" || fail "bench printed no tokens/s"
grep -q "(simulated)" "$work/bench.txt" || fail "bench does not name the simulated device"
echo "ok   bench device=cuda"

# Data parallel on the device: the gradient-communication rows measure the device path (the compute
# stream's wait, and NCCL over device buffers), not the host's MPI over host memory.
mpirun=(/usr/bin/mpiexec --oversubscribe --mca btl self,vader --mca pml ob1)
[[ $(id -u) == 0 ]] && mpirun+=(--allow-run-as-root)
(cd "$work" && "${mpirun[@]}" -n 2 "$mt" bench device=cuda --dp 2 steps=2 warmup=1 batch_size=2 seq_len=32 \
  model.n_layer=2 model.n_embd=64 >"$work/bench_dp.txt" 2>&1) || { tail -20 "$work/bench_dp.txt"; fail "bench device=cuda --dp 2"; }
grep -q "grad comm blocking.*NCCL on device buffers" "$work/bench_dp.txt" ||
  fail "bench --dp 2 on the device did not time NCCL: $(grep 'grad comm' "$work/bench_dp.txt")"
grep -q "grad comm wait.*compute stream's wait" "$work/bench_dp.txt" ||
  fail "bench --dp 2 on the device did not time the compute stream's wait"
echo "ok   bench device=cuda --dp 2: $(grep 'grad comm blocking' "$work/bench_dp.txt")"

"$mt" bench --calibrate device=cuda rows=64 seq_len=32 n_embd=64 n_head=4 out="$work/hw.json" \
  >"$work/calibrate.txt" 2>&1 || { tail -20 "$work/calibrate.txt"; fail "bench --calibrate device=cuda"; }
grep -q '"device": "cuda"' "$work/hw.json" || fail "the hardware file is not a device's"
"$mt" plan hw="$work/hw.json" >"$work/plan.txt" 2>&1 || { tail -5 "$work/plan.txt"; fail "plan hw=<calibrated file>"; }
echo "ok   bench --calibrate device=cuda, read back by plan"
