// `minitrain selftest --device cuda`: every op of kernels/ops.h run on the CUDA backend and on its CPU
// twin (kernels/cpu) on the same fresh random inputs, at small odd/prime shapes and at GPT-2 sizes,
// in each storage type (f32 and bf16 everywhere, f16 at the small shapes), then one whole training
// step of a small GPT on both backends (fp32 and bf16), with one table row per output compared. The GoogleTest GPU tests (tests/test_cuda_selftest.cpp)
// call the same checks, so the command and the test suite cannot drift apart.
//
// Error measure: max |cuda - cpu| / max |cpu| over one output (one number per output, so a single
// wrong element anywhere shows), against a per-op tolerance. Ops whose results must be bit-identical
// (round_to) or are yes/no answers (all_finite, masking, run-to-run determinism) report a count of
// mismatches against a tolerance of 0.
//
// The library compiles without the CUDA backend; then every entry point says the build has none.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace mt::cli {

// One compared output of one op at one shape.
struct OpCheckResult {
  std::string op;         // "matmul_bwd"
  std::string output;     // "dweight"
  std::string shape;      // "N=1024 IC=3072 OC=768"
  std::string dtype;      // the storage type S the op ran in ("f32", "bf16", "f16"); for convert the
                          // conversion ("f32->bf16"), for round_to its target type
  double error = 0;       // max relative error, or a mismatch count when `measure` says so
  double tolerance = 0;
  bool pass = false;
  std::string measure;    // "rel" (max relative error) or "count" (mismatching elements / answers)
  std::string message;    // why a check could not run (the backend's exception), else empty
};

// The checks in the order the selftest runs them; one per op of kernels/ops.h.
std::vector<std::string> selftest_check_names();

// Runs the named check at all its shapes. Inputs are drawn from an RNG keyed by (seed, name), so a
// check run alone sees the same inputs as in a full run with the same seed. A backend exception is
// reported as one failed result carrying its message, not thrown. `perturb` corrupts one element of
// every device result before it is compared, so every result must then fail: the proof that each
// comparison can fail. Needs a device (ops::cuda_unavailable_reason() empty); throws mt::Error otherwise
// or on an unknown name.
std::vector<OpCheckResult> run_op_check(const std::string& name, uint64_t seed, bool perturb = false);

// The table: a header, then one row per result as it comes, then a summary.
void print_selftest_header(FILE* out);
void print_selftest_row(FILE* out, const OpCheckResult& r);
// One machine-readable line that scripts/gpu_check.sh parses:
// "selftest summary: passed=P failed=F max_rel_err=E worst=<op>/<output>@<shape> err/tol=R"
void print_selftest_summary(FILE* out, const std::vector<OpCheckResult>& results);

// The `selftest` command. args: --device cuda (the default; the CPU is the reference, not a target),
// --seed S (default: fresh, printed), --op a,b (only these checks), --list, --perturb.
// Returns 0 when every check passed, 1 when one failed, 3 when CUDA cannot run here (one line on
// stderr says why). Bad flags throw mt::Error naming the flag (the CLI prints it and exits 2).
int selftest_main(const std::vector<std::string>& args);

}  // namespace mt::cli
