// The checks of `minitrain selftest` (cli/selftest.h) as GoogleTest cases: one test per op that the
// CUDA result matches the CPU twin at every shape, one that every comparison fails when a device
// result is corrupted (so no check is vacuous), and what the command promises on a machine without a
// GPU. The per-op tests skip when there is no CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "cli/selftest.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/fragment_probe.h"
#include "runtime/check.h"
#include "tests/test_util.h"

namespace {

using mt::cli::OpCheckResult;

std::string describe(const mt::cli::OpCheckResult& r) {
  return r.op + "/" + r.output + " at " + r.shape + " (" + r.dtype + "): " +
         mt::strfmt("error %.3g vs tolerance %.3g", r.error, r.tolerance) + (r.message.empty() ? "" : ": " + r.message);
}

// Everything written to `f` since it was opened.
std::string read_all(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  return s;
}

class CudaSelftest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (mt::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(CudaSelftest, CudaOpMatchesItsCpuTwinAtEveryShapeAndStorageType) {
  const std::vector<mt::cli::OpCheckResult> results = mt::cli::run_op_check(GetParam(), mt::testing::test_seed());
  if (results.empty() && GetParam() == "tensor_core_fragments" && !mt::cuda::fragment_probe::supported())
    GTEST_SKIP() << "no tensor-core instructions to probe below compute capability 8.0";
  ASSERT_FALSE(results.empty());
  for (const mt::cli::OpCheckResult& r : results) EXPECT_TRUE(r.pass) << describe(r);
  // Ops on activations are checked in every storage type; the rest work on fp32 only; the training
  // step runs in the two training precisions that matter on a GPU; the tensor-core probe in the two
  // 16-bit types the tensor-core kernels take.
  const std::set<std::string> fp32_ops = {"convert", "scale", "adamw", "sum_squares", "round_to", "all_finite"};
  if (GetParam() == "tensor_core_fragments") {
    std::set<std::string> dtypes;
    for (const mt::cli::OpCheckResult& r : results) dtypes.insert(r.dtype);
    EXPECT_EQ(dtypes, (std::set<std::string>{"bf16", "f16"}));
  } else if (GetParam() == "train_step") {
    std::set<std::string> dtypes;
    for (const mt::cli::OpCheckResult& r : results) dtypes.insert(r.dtype);
    EXPECT_EQ(dtypes, (std::set<std::string>{"f32", "bf16"}));
  } else if (fp32_ops.count(GetParam()) == 0) {
    std::set<std::string> dtypes;
    for (const mt::cli::OpCheckResult& r : results) dtypes.insert(r.dtype);
    EXPECT_EQ(dtypes, (std::set<std::string>{"f32", "bf16", "f16"}));
  }
}

TEST_P(CudaSelftest, EveryComparisonFailsWhenADeviceResultIsCorrupted) {
  const std::vector<mt::cli::OpCheckResult> results =
      mt::cli::run_op_check(GetParam(), mt::testing::test_seed(), /*perturb=*/true);
  if (results.empty() && GetParam() == "tensor_core_fragments" && !mt::cuda::fragment_probe::supported())
    GTEST_SKIP() << "no tensor-core instructions to probe below compute capability 8.0";
  ASSERT_FALSE(results.empty());
  for (const mt::cli::OpCheckResult& r : results) EXPECT_FALSE(r.pass) << "a corrupted result passed: " << describe(r);
}

INSTANTIATE_TEST_SUITE_P(EveryOp, CudaSelftest, ::testing::ValuesIn(mt::cli::selftest_check_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(Selftest, HasOneCheckForEveryOpOfTheInterfaceAndATrainingStep) {
  // The op list of kernels/ops.h; a new op needs a selftest check before it can run on a GPU unchecked.
  // The tensor-core fragment probe runs before the flash kernels; the whole training step comes last.
  const std::vector<std::string> ops = {
      "encoder_fwd",   "encoder_bwd",   "layernorm_fwd",       "residual_layernorm_fwd", "layernorm_bwd",
      "matmul_fwd",    "matmul_bwd",    "gelu_fwd",            "gelu_bwd",               "attention_fwd",
      "attention_bwd", "tensor_core_fragments", "flash_attention_fwd", "flash_attention_bwd", "flash_block", "add",
      "softmax_xent",
      "convert",       "scale",         "adamw",               "sum_squares",            "round_to",
      "all_finite",    "train_step"};
  EXPECT_EQ(mt::cli::selftest_check_names(), ops);
}

TEST(Selftest, WithoutADeviceSaysSoInOneLineAndExitsNonZero) {
  if (mt::cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  const int rc = mt::cli::selftest_main({"--device", "cuda", "--seed", "7"});
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 3);
  EXPECT_EQ(err, "selftest: no CUDA device found (cudaGetDeviceCount returned 0)\n");
  EXPECT_EQ(out, "") << "nothing but the one line";
  EXPECT_THROW(mt::cli::run_op_check("add", 1), mt::Error);
}

TEST(Selftest, RejectsBadFlagsNamingTheFlag) {
  auto message = [](const std::vector<std::string>& args) -> std::string {
    try {
      mt::cli::selftest_main(args);
    } catch (const mt::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message({"--device", "cpu"}).find("--device cpu"), std::string::npos);
  EXPECT_NE(message({"--op", "add,nonsense"}).find("'nonsense'"), std::string::npos);
  EXPECT_NE(message({"--seed", "-3"}).find("--seed"), std::string::npos);
  EXPECT_NE(message({"--seed"}).find("--seed needs a value"), std::string::npos);
  EXPECT_NE(message({"--fast"}).find("'--fast'"), std::string::npos);
  EXPECT_THROW(mt::cli::run_op_check("nonsense", 1), mt::Error);
}

TEST(Selftest, SummaryLineCountsFailuresAndNamesTheWorstResult) {
  const std::vector<mt::cli::OpCheckResult> results = {
      {"matmul_fwd", "out", "N=7", "f32", 2e-6, 1e-5, true, "rel", ""},
      {"layernorm_bwd", "dinp", "N=3 C=7", "f32", 4e-5, 1e-5, false, "rel", ""},
      {"round_to", "bits differ", "N=9", "bf16", 0, 0, true, "count", ""},
  };
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  mt::cli::print_selftest_summary(f, results);
  const std::string line = read_all(f);
  std::fclose(f);
  EXPECT_NE(line.find("passed=2 failed=1 max_rel_err=4.00e-05"), std::string::npos) << line;
  EXPECT_NE(line.find("worst=layernorm_bwd/dinp@N=3 C=7 err/tol=4"), std::string::npos) << line;
}

TEST(Selftest, TableRowsSayPassOrFailAndCarryTheErrorMessage) {
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  mt::cli::print_selftest_row(f, {"adamw", "m", "N=1001 t=3", "f32", 3e-7, 1e-6, true, "rel", ""});
  mt::cli::print_selftest_row(f, {"gelu_fwd", "(error)", "N=7", "f32", INFINITY, 0, false, "count",
                                    "CUDA error 700 at x.cu:1\nsecond line"});
  const std::string table = read_all(f);
  std::fclose(f);
  EXPECT_NE(table.find("| 3.00e-07    | 1e-06     | PASS   |"), std::string::npos) << table;
  EXPECT_NE(table.find("| FAIL   | CUDA error 700 at x.cu:1\n"), std::string::npos) << table;
  EXPECT_EQ(table.find("second line"), std::string::npos) << "a row stays one line";
}

}  // namespace
