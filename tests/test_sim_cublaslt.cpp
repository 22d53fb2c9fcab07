// The simulated device's cuBLASLt (sim/cublaslt.cpp): every supported type combination, transpose, batch,
// beta and epilogue against a double-precision reference; the product queued in stream order; and every input
// the library (or a race on a GPU) would refuse, failing with cuBLAS's own status and one line naming the
// call and the argument. The project's own path through it: tests/test_sim_cublaslt_gemm.cpp.
#include "tests/sim_lt_cases.h"

namespace {

using namespace mt::testing::sim_lt;

// ---- numbers ----

TEST_F(SimLt, ProductsOfEverySupportedTypeMatchADoublePrecisionReference) {
  for (const auto& combo : kCombos)
    for (int t = 0; t < 4; t++) {
      Case c = random_case();
      c.ab = combo[0], c.d = combo[1], c.ta = t & 1, c.tb = t & 2;
      c.alpha = 0.75f;
      SCOPED_TRACE(combo_name(c));
      const Data x = make(c);
      ASSERT_EQ(run(c, x), CUBLAS_STATUS_SUCCESS) << mt::sim::last_message();
      expect_matches_reference(c, x);
    }
}

TEST_F(SimLt, BatchedStridedProductsUseEachOperandsStride) {
  for (const auto& combo : kCombos) {
    Case c = random_case();
    c.ab = combo[0], c.d = combo[1], c.batch = 3, c.gap = 7, c.ta = true;
    c.broadcast_a = combo[1] == CUDA_R_32F;  // stride 0: one A for all
    SCOPED_TRACE(combo_name(c));
    const Data x = make(c);
    ASSERT_EQ(run(c, x), CUBLAS_STATUS_SUCCESS) << mt::sim::last_message();
    expect_matches_reference(c, x);
  }
}

TEST_F(SimLt, BetaAddsCInPlaceAndOutOfPlace) {
  for (const auto& combo : kCombos)
    for (bool out_of_place : {false, true}) {
      Case c = random_case();
      c.ab = combo[0], c.d = combo[1], c.beta = 0.5f, c.alpha = -1.25f, c.out_of_place = out_of_place, c.batch = 2;
      SCOPED_TRACE(combo_name(c) + (out_of_place ? " out of place (D starts as NaN)" : " in place"));
      const Data x = make(c);
      ASSERT_EQ(run(c, x), CUBLAS_STATUS_SUCCESS) << mt::sim::last_message();
      expect_matches_reference(c, x);
    }
}

TEST_F(SimLt, BetaZeroReadsNeitherCNorTheNaNInD) {
  Case c = random_case();
  c.ab = c.d = CUDA_R_16BF;
  Data x = make(c);
  x.d0.assign(c.d_count(), std::numeric_limits<float>::quiet_NaN());
  ASSERT_EQ(cudaMemcpy(x.dd, upload(x.d0, c.d), c.d_count() * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
  ASSERT_EQ(run(c, x), CUBLAS_STATUS_SUCCESS) << mt::sim::last_message();
  expect_matches_reference(c, x);  // every element inside D finite and right; the NaN padding untouched
}

TEST_F(SimLt, EachEpilogueMatchesItsReference) {
  for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                               CUBLASLT_EPILOGUE_DGELU})
    for (const auto& combo : kCombos) {
      Case c = random_case();
      c.ab = combo[0], c.d = combo[1], c.epilogue = e, c.tb = true;
      c.beta = e == CUBLASLT_EPILOGUE_BIAS ? 1.f : 0.f;  // the bias epilogue with a residual, as matmul_fwd uses it
      c.out_of_place = e == CUBLASLT_EPILOGUE_BIAS;
      SCOPED_TRACE(combo_name(c) + " epilogue " + std::to_string(int(e)));
      const Data x = make(c);
      ASSERT_EQ(run(c, x), CUBLAS_STATUS_SUCCESS) << mt::sim::last_message();
      expect_matches_reference(c, x);
    }
}

// ---- stream order ----

TEST_F(SimLt, ProductRunsOnlyWhenItsStreamIsWaitedFor) {
  Case c = random_case();
  const Data x = make(c);
  const size_t bytes = c.d_count() * 4;
  float* h = reinterpret_cast<float*>(pinned(bytes, 0));
  cudaStream_t s = stream();
  ASSERT_EQ(run(c, x, s), CUBLAS_STATUS_SUCCESS) << mt::sim::last_message();
  ASSERT_EQ(cudaMemcpyAsync(h, x.dd, bytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
  for (size_t i = 0; i < c.d_count(); i++) ASSERT_EQ(h[i], 0.f) << "nothing waited: the pinned buffer is stale";
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess) << mt::sim::last_message();
  const int64_t at = int64_t(c.n - 1) * c.ldd() + c.m - 1;  // D's last element, now the product
  EXPECT_NE(h[at], x.d0[size_t(at)]);
  // No synchronisation: a blocking copy to pageable memory (on the legacy stream, which waits for the
  // blocking stream s) reads the product.
  const Data y = make(c);
  ASSERT_EQ(run(c, y, s), CUBLAS_STATUS_SUCCESS) << mt::sim::last_message();
  expect_matches_reference(c, y);
}

TEST_F(SimLt, OperandFreedInStreamOrderBeforeTheProductRunsIsAnIllegalAddress) {
  Case c = random_case();
  Data x = make(c);
  cudaStream_t s = stream();
  void* a = nullptr;
  ASSERT_EQ(cudaMallocAsync(&a, c.a_count() * 4, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(a, x.a.data(), c.a_count() * 4, cudaMemcpyHostToDevice, s), cudaSuccess);
  Lt lt(c, x);
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  void* ws = device(lt.result.workspaceSize);
  x.da = a;
  ASSERT_EQ(cudaFreeAsync(a, nullptr), cudaSuccess);  // on the legacy stream: runs before s's later work
  ASSERT_EQ(lt.matmul(c, x, ws, lt.result.workspaceSize, s), CUBLAS_STATUS_SUCCESS) << "live at the call";
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
  ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(mt::sim::last_message(), "cublasLtMatmul (m=")) << mt::sim::last_message();
  EXPECT_TRUE(has(mt::sim::last_message(), ": A = ")) << mt::sim::last_message();
}

// ---- what the library refuses ----

// Runs f with stderr captured; expects status `want` and exactly one printed line holding every part.
template <class F>
void expect_failure(F&& f, cublasStatus_t want, const std::vector<std::string>& parts) {
  ::testing::internal::CaptureStderr();
  const cublasStatus_t got = f();
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(got, want) << cublasLtGetStatusString(got) << ": " << printed;
  const std::string m = mt::sim::last_message();
  EXPECT_EQ(printed, "simulated device: " + m + "\n") << "one line, printed";
  for (const std::string& p : parts) EXPECT_TRUE(has(m, p)) << "'" << p << "' not in: " << m;
}

TEST_F(SimLt, HostPointerOperandFailsNamingTheCallAndTheOperand) {
  Case c = random_case();
  c.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  Data x = make(c);
  std::vector<float> host(c.b_count() + c.aux_count() + 64);
  Lt lt(c, x);
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  void* ws = device(lt.result.workspaceSize);
  Data bad = x;
  bad.db = host.data();
  expect_failure([&] { return lt.matmul(c, bad, ws, lt.result.workspaceSize, nullptr); }, CUBLAS_STATUS_INVALID_VALUE,
                 {"cublasLtMatmul: B = " + hex(host.data()) + " is pageable host memory"});
  lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, (void*)host.data());
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS) << "the heuristic reads the pointer's alignment only";
  expect_failure([&] { return lt.matmul(c, x, ws, lt.result.workspaceSize, nullptr); }, CUBLAS_STATUS_INVALID_VALUE,
                 {"cublasLtMatmul: aux = "});
  lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, x.daux);
  expect_failure([&] { return lt.matmul(c, x, host.data(), lt.result.workspaceSize, nullptr); },
                 CUBLAS_STATUS_INVALID_VALUE, {"cublasLtMatmul: workspace = "});
  const float alpha = 1.f;
  float* dalpha = reinterpret_cast<float*>(upload({1.f}, CUDA_R_32F));
  expect_failure([&] {
    return cublasLtMatmul(lt.handle, lt.op, dalpha, x.da, lt.a, x.db, lt.b, &alpha, x.dd, lt.d, x.dd, lt.d,
                          &lt.result.algo, ws, lt.result.workspaceSize, nullptr);
  }, CUBLAS_STATUS_INVALID_VALUE, {"cublasLtMatmul: alpha = ", "device memory; the pointer mode is host"});
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cuBLAS failures leave CUDA's last error alone";
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "nothing was queued";
  EXPECT_EQ(download(x.dd, c.d_count(), c.d), x.d0);
}

TEST_F(SimLt, UnsupportedTypeCombinationsAreNotSupportedByTheHeuristicAndTheMatmul) {
  struct Bad {
    cudaDataType_t a, b, d;
    cublasComputeType_t compute;
    cudaDataType_t scale;
    const char* part;
  };
  const Bad bad[] = {
      {CUDA_R_32F, CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F, "A CUDA_R_32F, B CUDA_R_16BF"},
      {CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F, "D CUDA_R_16F"},
      {CUDA_R_32F, CUDA_R_32F, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F, "D CUDA_R_16BF"},
      {CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_32F, CUDA_R_32F, "A CUDA_R_64F"},
      {CUDA_R_16F, CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_16F, CUDA_R_16F, "compute type"},
      {CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, "compute type"},
  };
  for (const Bad& t : bad) {
    SCOPED_TRACE(t.part);
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t pref;
    ASSERT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatmulDescCreate(&op, t.compute, t.scale), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&a, t.a, 8, 8, 8), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&b, t.b, 8, 8, 8), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&d, t.d, 8, 8, 8), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t r{};
    int found = -1;
    expect_failure([&] { return cublasLtMatmulAlgoGetHeuristic(h, op, a, b, d, d, pref, 1, &r, &found); },
                   CUBLAS_STATUS_NOT_SUPPORTED, {"cublasLtMatmulAlgoGetHeuristic: ", t.part});
    EXPECT_EQ(found, 0);
    void* m = device(8 * 8 * 8);
    const double one = 1;  // large enough for any scale type
    expect_failure([&] {
      return cublasLtMatmul(h, op, &one, m, a, m, b, &one, m, d, m, d, nullptr, nullptr, 0, nullptr);
    }, CUBLAS_STATUS_NOT_SUPPORTED, {"cublasLtMatmul: ", t.part});
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
  }
}

TEST_F(SimLt, UnsimulatedAttributesAndEpiloguesFailNamingThemselves) {
  Case c;
  const Data x = make(c);
  Lt lt(c, x);
  const int32_t mode = CUBLASLT_POINTER_MODE_DEVICE;
  expect_failure([&] { return cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, 4); },
                 CUBLAS_STATUS_NOT_SUPPORTED, {"cublasLtMatmulDescSetAttribute: CUBLASLT_MATMUL_DESC_POINTER_MODE"});
  const int32_t type = CUDA_R_32F;
  expect_failure(
      [&] { return cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, 4); },
      CUBLAS_STATUS_NOT_SUPPORTED, {"CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE is not simulated"});
  for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_DGELU_BGRAD,
                               CUBLASLT_EPILOGUE_BGRADB})
    expect_failure([&] { return cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, 4); },
                   CUBLAS_STATUS_NOT_SUPPORTED, {"CUBLASLT_MATMUL_DESC_EPILOGUE = CUBLASLT_EPILOGUE_", "not simulated"});
  const int32_t order = CUBLASLT_ORDER_ROW;
  expect_failure([&] { return cublasLtMatrixLayoutSetAttribute(lt.a, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, 4); },
                 CUBLAS_STATUS_NOT_SUPPORTED, {"cublasLtMatrixLayoutSetAttribute: CUBLASLT_MATRIX_LAYOUT_ORDER"});
  const uint32_t search = CUBLASLT_SEARCH_BEST_FIT;
  expect_failure(
      [&] { return cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &search, 4); },
      CUBLAS_STATUS_NOT_SUPPORTED, {"CUBLASLT_MATMUL_PREF_SEARCH_MODE is not simulated"});
  // A batched product with an epilogue: the stand-in implements epilogues at batch 1 only.
  Case batched;
  batched.batch = 2, batched.epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
  const Data y = make(batched);
  Lt lb(batched, y);
  expect_failure([&] { return lb.heuristic(); }, CUBLAS_STATUS_NOT_SUPPORTED,
                 {"CUBLASLT_EPILOGUE_GELU_AUX with batch count 2 is not simulated"});
}

TEST_F(SimLt, AttributeOfTheWrongSizeIsInvalidNamingIt) {
  Case c;
  const Data x = make(c);
  Lt lt(c, x);
  const int64_t wide = CUBLAS_OP_T;
  expect_failure([&] { return cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &wide, 8); },
                 CUBLAS_STATUS_INVALID_VALUE,
                 {"CUBLASLT_MATMUL_DESC_TRANSA takes 4 bytes (int32_t), given sizeInBytes = 8"});
  const int32_t narrow = 16;
  expect_failure([&] { return cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &narrow, 4); },
                 CUBLAS_STATUS_INVALID_VALUE, {"CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD takes 8 bytes (int64_t)"});
  const int64_t count = 2;
  expect_failure([&] { return cublasLtMatrixLayoutSetAttribute(lt.a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, 8); },
                 CUBLAS_STATUS_INVALID_VALUE, {"CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT takes 4 bytes"});
  const uint64_t align = 16;
  expect_failure(
      [&] { return cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, 8); },
      CUBLAS_STATUS_INVALID_VALUE, {"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES takes 4 bytes (uint32_t)"});
  const uint32_t ws = 1024;
  expect_failure(
      [&] { return cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, 4); },
      CUBLAS_STATUS_INVALID_VALUE, {"CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES takes 8 bytes (uint64_t)"});
}

TEST_F(SimLt, AuxLeadingDimensionMustBeAMultipleOf8AndAtLeastM) {
  Case c = random_case();
  c.m = 10, c.epilogue = CUBLASLT_EPILOGUE_DGELU;
  const Data x = make(c);
  Lt lt(c, x);
  for (int64_t ld : {int64_t(12), int64_t(8)}) {
    lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ld);
    expect_failure([&] { return lt.heuristic(); }, CUBLAS_STATUS_INVALID_VALUE,
                   {"cublasLtMatmulAlgoGetHeuristic: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = " + std::to_string(ld) +
                    " must be a multiple of 8 and at least m = 10"});
    EXPECT_EQ(lt.found, 0);
  }
  lt.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(16));
  EXPECT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
}

TEST_F(SimLt, PromiseBelowTheElementSizeFindsNoAlgorithm) {
  Case c;
  const Data x = make(c);
  Lt lt(c, x);
  lt.prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(2));
  expect_failure([&] { return lt.heuristic(); }, CUBLAS_STATUS_NOT_SUPPORTED,
                 {"no algorithm: MIN_ALIGNMENT_A_BYTES = 2 is less than the 4-byte elements of A"});
  EXPECT_EQ(lt.found, 0);
  Case h;
  h.ab = h.d = CUDA_R_16F;
  const Data y = make(h);
  Lt lh(h, y);
  lh.prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(2));
  EXPECT_EQ(lh.heuristic(), CUBLAS_STATUS_SUCCESS) << "2-byte elements, 2-byte alignment";
}

TEST_F(SimLt, PointerLessAlignedThanPromisedIsInvalidNamingIt) {
  Case c;
  c.ab = c.d = CUDA_R_16BF, c.m = 8, c.n = 4, c.k = 8;
  Data x = make(c);
  // A one element into a block: 2-byte aligned.
  std::vector<float> shifted(c.a_count() + 1, 0.f);
  std::copy(x.a.begin(), x.a.end(), shifted.begin() + 1);
  x.da = static_cast<char*>(upload(shifted, c.ab)) + 2;
  {
    Lt lt(c, x);  // the default promise: 256 bytes
    ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
    void* ws = device(lt.result.workspaceSize);
    expect_failure([&] { return lt.matmul(c, x, ws, lt.result.workspaceSize, nullptr); }, CUBLAS_STATUS_INVALID_VALUE,
                   {"cublasLtMatmul: A = " + hex(x.da) +
                    " is 2-byte aligned, less than the 256 bytes MIN_ALIGNMENT_A_BYTES promised"});
  }
  Lt lt(c, x);
  lt.prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(2));
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  void* ws = device(lt.result.workspaceSize);
  ASSERT_EQ(lt.matmul(c, x, ws, lt.result.workspaceSize, nullptr), CUBLAS_STATUS_SUCCESS) << mt::sim::last_message();
  expect_matches_reference(c, x);
}

TEST_F(SimLt, WorkspaceSmallerThanTheHeuristicReportedIsInvalid) {
  Case c = random_case();
  const Data x = make(c);
  Lt lt(c, x);
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  const size_t need = lt.result.workspaceSize;
  ASSERT_GT(need, 0u) << "with 32 MiB allowed the stand-in asks for some, so that the check can fail";
  void* ws = device(need);
  expect_failure([&] { return lt.matmul(c, x, ws, need - 1, nullptr); }, CUBLAS_STATUS_INVALID_VALUE,
                 {"cublasLtMatmul: workspaceSizeInBytes = " + std::to_string(need - 1) + " is less than the " +
                  std::to_string(need) + " bytes the algorithm needs"});
  void* small = device(need / 2);
  expect_failure([&] { return lt.matmul(c, x, small, need, nullptr); }, CUBLAS_STATUS_INVALID_VALUE,
                 {"cublasLtMatmul: workspace = " + hex(small), "past the end"});
  // Without workspace allowed, none is needed.
  lt.prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(0));
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(lt.result.workspaceSize, 0u);
  EXPECT_EQ(lt.matmul(c, x, nullptr, 0, nullptr), CUBLAS_STATUS_SUCCESS) << mt::sim::last_message();
  // No algo: the library's own query, with default preferences (no workspace).
  EXPECT_EQ(cublasLtMatmul(lt.handle, lt.op, &c.alpha, x.da, lt.a, x.db, lt.b, &c.beta, x.dd, lt.d, x.dd, lt.d, nullptr,
                           nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS)
      << mt::sim::last_message();
  expect_matches_reference(c, x);
}

TEST_F(SimLt, ShapesLeadingDimensionsAndOverlapsAreChecked) {
  Case c;
  c.m = 6, c.n = 5, c.k = 8;  // A (6 x 8, ld 9) holds more than D (6 x 5, ld 9): D can lie inside it
  Data x = make(c);
  {
    Lt lt(c, x);
    cublasLtMatrixLayoutDestroy(lt.a);
    Lt::layout(&lt.a, c.ab, 6, 8, 5, 0, 1);  // ld 5 < 6 rows
    expect_failure([&] { return lt.heuristic(); }, CUBLAS_STATUS_INVALID_VALUE, {"Adesc: ld 5 is less than its 6 rows"});
    cublasLtMatrixLayoutDestroy(lt.a);
    Lt::layout(&lt.a, c.ab, 6, 3, 6, 0, 1);  // k 3 against B's 8
    expect_failure([&] { return lt.heuristic(); }, CUBLAS_STATUS_INVALID_VALUE,
                   {"op(A) is 6 x 3 and op(B) 8 x 5, but D is 6 x 5"});
  }
  Lt lt(c, x);
  ASSERT_EQ(lt.heuristic(), CUBLAS_STATUS_SUCCESS);
  void* ws = device(lt.result.workspaceSize);
  Data alias = x;
  alias.dd = x.da;  // D written over A
  expect_failure([&] { return lt.matmul(c, alias, ws, lt.result.workspaceSize, nullptr); }, CUBLAS_STATUS_INVALID_VALUE,
                 {"cublasLtMatmul: D and A overlap"});
  cublasLtMatmulAlgo_t forged{};
  expect_failure([&] {
    return cublasLtMatmul(lt.handle, lt.op, &c.alpha, x.da, lt.a, x.db, lt.b, &c.beta, x.dd, lt.d, x.dd, lt.d, &forged,
                          ws, lt.result.workspaceSize, nullptr);
  }, CUBLAS_STATUS_INVALID_VALUE, {"algo did not come from cublasLtMatmulAlgoGetHeuristic"});
  lt.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_T);  // the algo was found for B untransposed
  cublasLtMatrixLayoutDestroy(lt.b);
  Lt::layout(&lt.b, c.ab, 5, 8, 5, 0, 1);
  expect_failure([&] { return lt.matmul(c, x, ws, lt.result.workspaceSize, nullptr); }, CUBLAS_STATUS_INVALID_VALUE,
                 {"algo did not come from cublasLtMatmulAlgoGetHeuristic for these types, transposes"});
}

TEST_F(SimLt, DestroyedDescriptorsAndHandlesAreRefused) {
  cublasLtMatrixLayout_t l;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 4, 4, 4), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutDestroy(l), CUBLAS_STATUS_SUCCESS);
  const int32_t count = 2;
  expect_failure([&] { return cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, 4); },
                 CUBLAS_STATUS_INVALID_VALUE, {"matLayout = ", "is not a live matrix layout"});
  expect_failure([&] { return cublasLtMatrixLayoutDestroy(l); }, CUBLAS_STATUS_INVALID_VALUE, {"not a live"});
  cublasLtHandle_t h;
  ASSERT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtDestroy(h), CUBLAS_STATUS_SUCCESS);
  expect_failure([&] { return cublasLtDestroy(h); }, CUBLAS_STATUS_NOT_INITIALIZED, {"not a live cuBLASLt handle"});
}

TEST_F(SimLt, StatusStringsAreTheLibrarysNames) {
  EXPECT_STREQ(cublasLtGetStatusString(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_STREQ(cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_STREQ(cublasLtGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_STREQ(cublasLtGetStatusString(CUBLAS_STATUS_EXECUTION_FAILED), "CUBLAS_STATUS_EXECUTION_FAILED");
}

}  // namespace
