// The project's GEMM, mt::cuda::gemm (kernels/cuda/gemm.cu), on the simulated cuBLASLt: every path against
// the double-precision reference, and the fused epilogue and its fallback kernel (on the warp emulator)
// giving the same bits.
#include <cstdlib>

#include "kernels/cuda/gemm.cuh"
#include "runtime/check.h"
#include "tests/sim_lt_cases.h"

namespace {

using namespace mt::testing::sim_lt;

mt::DType dtype(cudaDataType_t t) {
  return t == CUDA_R_16BF ? mt::DType::bf16 : t == CUDA_R_16F ? mt::DType::f16 : mt::DType::f32;
}

mt::cuda::Gemm project_gemm(const Case& c, const Data& x) {
  mt::cuda::Gemm g;
  g.m = c.m, g.n = c.n, g.k = c.k, g.batch = c.batch;
  g.trans_a = c.ta, g.trans_b = c.tb;
  g.ab_type = dtype(c.ab), g.d_type = dtype(c.d);
  g.a = x.da, g.lda = c.lda(), g.stride_a = c.sa();
  g.b = x.db, g.ldb = c.ldb(), g.stride_b = c.sb();
  g.d = x.dd, g.ldd = c.ldd(), g.stride_d = c.sd();
  g.alpha = c.alpha, g.beta = c.beta;
  g.c = c.out_of_place ? x.dc : nullptr;
  g.bias = x.dbias;
  g.epilogue = writes_aux(c.epilogue) ? mt::cuda::Epilogue::gelu
               : c.epilogue == CUBLASLT_EPILOGUE_DGELU ? mt::cuda::Epilogue::dgelu
                                                       : mt::cuda::Epilogue::none;
  g.aux = x.daux;
  return g;
}

// Sets MT_SIM_CUBLASLT_NO_ALGO (sim/cublaslt.cpp) for one scope: "" leaves cuBLASLt every algorithm.
// The project's cached plans are dropped on the way in and out: they hold the library's old answers.
class NoAlgorithm {
 public:
  explicit NoAlgorithm(const char* which) {
    mt::cuda::clear_gemm_plans();
    if (*which) setenv("MT_SIM_CUBLASLT_NO_ALGO", which, 1);
  }
  ~NoAlgorithm() {
    unsetenv("MT_SIM_CUBLASLT_NO_ALGO");
    mt::cuda::clear_gemm_plans();
  }
};

// The heuristic is asked once per configuration; later calls reuse the plan with their own pointers,
// bias included. A configuration differing in shape, transpose, epilogue or alignment asks again.
TEST_F(SimLt, ProjectGemmAsksTheHeuristicOncePerConfiguration) {
  cudaStream_t s = stream();
  const mt::ops::Ctx ctx{mt::Device::cuda, s};
  mt::cuda::clear_gemm_plans();
  Case c;
  c.m = 24, c.n = 16, c.k = 8, c.ta = true, c.epilogue = CUBLASLT_EPILOGUE_BIAS;
  c.ab = c.d = CUDA_R_16BF;
  const uint64_t before = mt::sim::lt_heuristic_calls();
  for (int call = 0; call < 3; call++) {  // fresh operands and bias each time, at other addresses
    SCOPED_TRACE("call " + std::to_string(call));
    const Data x = make(c);
    mt::cuda::gemm(project_gemm(c, x), ctx);
    expect_matches_reference(c, x);
  }
  EXPECT_EQ(mt::sim::lt_heuristic_calls() - before, 1u);
  Case other = c;
  other.tb = true;
  const Data y = make(other);
  mt::cuda::gemm(project_gemm(other, y), ctx);
  expect_matches_reference(other, y);
  EXPECT_EQ(mt::sim::lt_heuristic_calls() - before, 2u) << "a transposed B is another configuration";
  Case odd = c;
  odd.d_pad = 1;  // ldd 25: D's columns only 2-byte aligned, less than the 16 bytes promised before
  const Data z = make(odd);
  mt::cuda::gemm(project_gemm(odd, z), ctx);
  expect_matches_reference(odd, z);
  EXPECT_EQ(mt::sim::lt_heuristic_calls() - before, 3u) << "a less aligned D is another configuration";
}

// Bias and C together (matmul_fwd with a residual): cuBLASLt adds beta C to the product, then the bias
// (cublasLt.h: D = alpha A B + beta C + bias). The fallback's epilogue kernel must add them in that
// order too, or the two paths round differently.
TEST_F(SimLt, ProjectGemmFallbackAddsCThenTheBiasAsCublasLtDoes) {
  cudaStream_t s = stream();
  const mt::ops::Ctx ctx{mt::Device::cuda, s};
  for (const auto& combo : kCombos) {
    Case c;
    c.m = 37, c.n = 29, c.k = 23, c.ta = true, c.beta = 1.f, c.out_of_place = true;
    c.epilogue = CUBLASLT_EPILOGUE_BIAS, c.ab = combo[0], c.d = combo[1];
    SCOPED_TRACE(combo_name(c));
    const Data x = make(c);
    std::vector<float> results[2];
    for (int path = 0; path < 2; path++) {
      const NoAlgorithm no_algo(path == 0 ? "" : "epilogues");
      Data y = x;
      y.dd = upload(x.d0, c.d);
      mt::cuda::gemm(project_gemm(c, y), ctx);
      results[path] = download(y.dd, c.d_count(), c.d);
    }
    for (size_t i = 0; i < results[0].size(); i++)
      if (!std::isnan(results[0][i]) || !std::isnan(results[1][i])) {  // NaN: outside D's matrix, unwritten
        ASSERT_EQ(mt::f32_bits(results[0][i]), mt::f32_bits(results[1][i]))
            << "value " << i << ": fused " << results[0][i] << ", fallback " << results[1][i];
      }
  }
}

// Every path: cuBLASLt fused, the epilogue kernel after cuBLASLt's product, and the built-in product kernel.
TEST_F(SimLt, ProjectGemmMatchesTheReferenceOnEveryPath) {
  cudaStream_t s = stream();
  const mt::ops::Ctx ctx{mt::Device::cuda, s};
  for (const char* refused : {"", "epilogues", "all"}) {
    SCOPED_TRACE(std::string("MT_SIM_CUBLASLT_NO_ALGO=") + refused);
    const NoAlgorithm no_algo(refused);
    for (const auto& combo : kCombos) {
      Case c = random_case();  // dweight's shape: fp32 gradients accumulate (beta 1), B transposed, batched
      c.ab = combo[0], c.d = combo[1], c.tb = true, c.beta = 1.f, c.batch = 2;
      SCOPED_TRACE(combo_name(c));
      const Data x = make(c);
      mt::cuda::gemm(project_gemm(c, x), ctx);
      expect_matches_reference(c, x);
    }
    Case c = random_case();  // matmul_fwd with bias and residual: cuBLASLt's out-of-place C
    c.ab = c.d = CUDA_R_16BF, c.ta = true, c.epilogue = CUBLASLT_EPILOGUE_BIAS, c.beta = 1.f, c.out_of_place = true;
    const Data x = make(c);
    mt::cuda::gemm(project_gemm(c, x), ctx);
    expect_matches_reference(c, x);
  }
}

// gemm.cu fuses GELU when the aux leading dimension (ldd) is a multiple of 8, and otherwise runs the product
// into an fp32 temporary and its epilogue kernel (on the warp emulator here): both round once from the same
// fp32 value, so they agree bit for bit.
TEST_F(SimLt, ProjectGemmFusedAndFallbackEpiloguesGiveTheSameBits) {
  cudaStream_t s = stream();
  const mt::ops::Ctx ctx{mt::Device::cuda, s};
  for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_DGELU})
    for (const auto& combo : {kCombos[0], kCombos[1], kCombos[3]}) {
      Case fused = random_case();
      fused.m = 13, fused.d_pad = 3, fused.aux_pad = 0, fused.epilogue = e;  // ldd = aux ld = 16
      fused.ab = combo[0], fused.d = combo[1];
      Case fallback = fused;
      fallback.d_pad = 0;  // ldd 13: not a multiple of 8
      SCOPED_TRACE(combo_name(fused) + " epilogue " + std::to_string(int(e)));
      const Data x = make(fused);
      std::vector<float> results[2];
      for (int path = 0; path < 2; path++) {
        const Case& c = path == 0 ? fused : fallback;
        Data y = x;  // fresh D and aux (gemm.cu's aux has D's leading dimension)
        y.d0.assign(c.d_count(), 0.f);
        y.dd = upload(y.d0, c.d);
        const size_t aux_n = size_t(c.ldd()) * size_t(c.n);
        std::vector<float> aux(aux_n, 0.f);
        for (int j = 0; j < c.n; j++)
          for (int i = 0; i < c.m; i++) aux[size_t(j * c.ldd() + i)] = x.aux[size_t(j * fused.aux_ld() + i)];
        y.daux = upload(aux, c.d);
        mt::cuda::gemm(project_gemm(c, y), ctx);
        if (path == 0) expect_matches_reference(c, y);
        const std::vector<float> d = download(y.dd, c.d_count(), c.d);
        const std::vector<float> a = download(y.daux, aux_n, c.d);
        for (int j = 0; j < c.n; j++)
          for (int i = 0; i < c.m; i++) {
            results[path].push_back(d[size_t(j * c.ldd() + i)]);
            if (writes_aux(e)) results[path].push_back(a[size_t(j * c.ldd() + i)]);
          }
      }
      ASSERT_EQ(results[0].size(), results[1].size());
      for (size_t i = 0; i < results[0].size(); i++)
        ASSERT_EQ(mt::f32_bits(results[0][i]), mt::f32_bits(results[1][i]))
            << "value " << i << ": fused " << results[0][i] << ", fallback " << results[1][i];
    }
}

TEST_F(SimLt, ProjectGemmOnAHostOperandThrowsNamingTheCublasLtCall) {
  Case c = random_case();
  Data x = make(c);
  std::vector<float> host(c.a_count());
  x.da = host.data();
  ::testing::internal::CaptureStderr();
  try {
    mt::cuda::gemm(project_gemm(c, x), mt::ops::Ctx{mt::Device::cuda, nullptr});
    ADD_FAILURE() << "no throw";
  } catch (const mt::Error& e) {
    EXPECT_TRUE(has(e.what(), "cuBLAS error 7 (CUBLAS_STATUS_INVALID_VALUE) in `cublasLtMatmul(")) << e.what();
  }
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(printed, "cublasLtMatmul: A = " + hex(host.data()) + " is pageable host memory")) << printed;
}

}  // namespace
