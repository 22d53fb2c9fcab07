// The simulated device's cuBLASLt (sim/cublaslt.cpp): every supported type combination, transpose, batch,
// beta and epilogue against a double-precision reference; the product queued in stream order; and every input
// the library (or a race on a GPU) would refuse, failing with cuBLAS's own status and one line naming the
// call and the argument. Then the project's own path, mt::cuda::gemm (kernels/cuda/gemm.cu), on the stand-in:
// the fused epilogue and its fallback kernel (on the warp emulator) give the same bits.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cuda/gemm.cuh"
#include "runtime/check.h"
#include "runtime/dtype.h"
#include "sim/sim.h"
#include "tests/sim_test_util.h"

namespace {

using namespace mt::testing::sim;

constexpr uint64_t kMaxWorkspace = uint64_t(32) << 20;

size_t elem(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

float round_to(cudaDataType_t t, float v) {
  return t == CUDA_R_16BF ? mt::round_bf16(v) : t == CUDA_R_16F ? mt::round_f16(v) : v;
}

// The unit roundoff of a type: the rounding on store.
double eps(cudaDataType_t t) { return t == CUDA_R_16BF ? 0x1p-8 : t == CUDA_R_16F ? 0x1p-11 : 0x1p-24; }

double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  const double t = std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
}

bool has_bias(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool writes_aux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool uses_aux(cublasLtEpilogue_t e) { return writes_aux(e) || e == CUBLASLT_EPILOGUE_DGELU; }

// One GEMM in cuBLASLt's terms: column-major D (m x n) = alpha op(A) op(B) + beta C, then the epilogue.
struct Case {
  int m = 1, n = 1, k = 1, batch = 1;
  bool ta = false, tb = false;
  cudaDataType_t ab = CUDA_R_32F, d = CUDA_R_32F;
  int pad = 3, d_pad = 3;        // leading dimensions are rows + pad (D's: m + d_pad)
  int64_t gap = 0;               // batch strides are one matrix plus gap elements
  bool broadcast_a = false;      // A's batch stride 0: one A for every batch
  float alpha = 1.f, beta = 0.f;
  bool out_of_place = false;     // C a matrix of its own; else C is D
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int aux_pad = 5;               // aux's leading dimension: m rounded up to 8, plus aux_pad rounded to 8

  int a_rows() const { return ta ? k : m; }
  int a_cols() const { return ta ? m : k; }
  int b_rows() const { return tb ? n : k; }
  int b_cols() const { return tb ? k : n; }
  int lda() const { return a_rows() + pad; }
  int ldb() const { return b_rows() + pad; }
  int ldd() const { return m + d_pad; }
  int64_t sa() const { return broadcast_a ? 0 : int64_t(lda()) * a_cols() + gap; }
  int64_t sb() const { return int64_t(ldb()) * b_cols() + gap; }
  int64_t sd() const { return int64_t(ldd()) * n + gap; }
  int64_t aux_ld() const { return (m + 7) / 8 * 8 + (aux_pad + 7) / 8 * 8; }
  size_t a_count() const { return size_t((batch - 1) * sa() + int64_t(lda()) * a_cols()); }
  size_t b_count() const { return size_t((batch - 1) * sb() + int64_t(ldb()) * b_cols()); }
  size_t d_count() const { return size_t((batch - 1) * sd() + int64_t(ldd()) * n); }
  size_t aux_count() const { return size_t(aux_ld() * n); }
};

// A case's matrices on the host (values already rounded to their types) and on the device.
struct Data {
  std::vector<float> a, b, c, d0, bias, aux;
  void *da = nullptr, *db = nullptr, *dc = nullptr, *dd = nullptr, *dbias = nullptr, *daux = nullptr;
};

// The descriptors of one call, destroyed at scope exit.
struct Lt {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;

  Lt(const Case& c, const Data& x) {
    EXPECT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
    layout(&a, c.ab, c.a_rows(), c.a_cols(), c.lda(), c.sa(), c.batch);
    layout(&b, c.ab, c.b_rows(), c.b_cols(), c.ldb(), c.sb(), c.batch);
    layout(&d, c.d, c.m, c.n, c.ldd(), c.sd(), c.batch);
    EXPECT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    set(CUBLASLT_MATMUL_DESC_TRANSA, c.ta ? CUBLAS_OP_T : CUBLAS_OP_N);
    set(CUBLASLT_MATMUL_DESC_TRANSB, c.tb ? CUBLAS_OP_T : CUBLAS_OP_N);
    if (c.epilogue != CUBLASLT_EPILOGUE_DEFAULT) set(CUBLASLT_MATMUL_DESC_EPILOGUE, c.epilogue);
    if (has_bias(c.epilogue)) set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, (const void*)x.dbias);
    if (uses_aux(c.epilogue)) {
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, x.daux);
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, c.aux_ld());
    }
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kMaxWorkspace,
                                                   sizeof kMaxWorkspace),
              CUBLAS_STATUS_SUCCESS);
  }
  ~Lt() {
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(handle);
  }
  static void layout(cublasLtMatrixLayout_t* l, cudaDataType_t t, int rows, int cols, int ld, int64_t stride,
                     int32_t batch) {
    EXPECT_EQ(cublasLtMatrixLayoutCreate(l, t, uint64_t(rows), uint64_t(cols), ld), CUBLAS_STATUS_SUCCESS);
    if (batch == 1) return;
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
              CUBLAS_STATUS_SUCCESS);
  }
  template <class T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& v) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, attr, &v, sizeof v), CUBLAS_STATUS_SUCCESS) << mt::sim::last_message();
  }
  template <class T>
  void prefer(cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof v), CUBLAS_STATUS_SUCCESS);
  }
  cublasStatus_t heuristic() {
    return cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, d, d, pref, 1, &result, &found);
  }
  cublasStatus_t matmul(const Case& c, const Data& x, void* workspace, size_t bytes, cudaStream_t s) {
    const void* cp = c.out_of_place ? x.dc : x.dd;
    return cublasLtMatmul(handle, op, &c.alpha, x.da, a, x.db, b, &c.beta, cp, d, x.dd, d, &result.algo, workspace,
                          bytes, s);
  }
};

class SimLt : public Sim {
 protected:
  std::vector<float> random_matrix(size_t n, cudaDataType_t t, float lo = -1.f, float hi = 1.f) {
    std::vector<float> v = mt::testing::random_floats(n, rng_, lo, hi);
    for (float& x : v) x = round_to(t, x);
    return v;
  }
  void* upload(const std::vector<float>& v, cudaDataType_t t) {
    bytes h(v.size() * elem(t));
    for (size_t i = 0; i < v.size(); i++) {
      if (t == CUDA_R_32F) {
        std::memcpy(&h[i * 4], &v[i], 4);
      } else {
        const uint16_t bits = t == CUDA_R_16BF ? mt::f32_to_bf16(v[i]) : mt::f32_to_f16(v[i]);
        std::memcpy(&h[i * 2], &bits, 2);
      }
    }
    void* d = device(std::max<size_t>(h.size(), 1));
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  }
  std::vector<float> download(const void* d, size_t n, cudaDataType_t t) {
    const bytes h = read(d, n * elem(t));
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
      if (t == CUDA_R_32F) {
        std::memcpy(&v[i], &h[i * 4], 4);
      } else {
        uint16_t bits;
        std::memcpy(&bits, &h[i * 2], 2);
        v[i] = t == CUDA_R_16BF ? mt::bf16_to_f32(bits) : mt::f16_to_f32(bits);
      }
    }
    return v;
  }
  // Random operands for case c on the host and the device; D starts as C (in place) or as NaN.
  Data make(const Case& c) {
    Data x;
    x.a = random_matrix(c.a_count(), c.ab);
    x.b = random_matrix(c.b_count(), c.ab);
    x.d0 = c.out_of_place ? std::vector<float>(c.d_count(), std::numeric_limits<float>::quiet_NaN())
                          : random_matrix(c.d_count(), c.d);
    if (c.out_of_place) x.c = random_matrix(c.d_count(), c.d);
    if (has_bias(c.epilogue)) x.bias = random_matrix(size_t(c.m), c.d);
    if (uses_aux(c.epilogue)) x.aux = random_matrix(c.aux_count(), c.d, -3.f, 3.f);
    x.da = upload(x.a, c.ab), x.db = upload(x.b, c.ab), x.dd = upload(x.d0, c.d);
    if (c.out_of_place) x.dc = upload(x.c, c.d);
    if (!x.bias.empty()) x.dbias = upload(x.bias, c.d);
    if (!x.aux.empty()) x.daux = upload(x.aux, c.d);
    return x;
  }
  // Describes, queries and queues case c; returns the first status that is not success.
  cublasStatus_t run(const Case& c, const Data& x, cudaStream_t s = nullptr) {
    Lt lt(c, x);
    if (cublasStatus_t st = lt.heuristic(); st != CUBLAS_STATUS_SUCCESS) return st;
    EXPECT_EQ(lt.found, 1);
    void* ws = lt.result.workspaceSize ? device(lt.result.workspaceSize) : nullptr;
    return lt.matmul(c, x, ws, lt.result.workspaceSize, s);
  }
  // Compares D (and a written aux) with the double-precision reference, and checks that nothing outside
  // D's matrices changed.
  void expect_matches_reference(const Case& c, const Data& x) {
    const std::vector<float> d = download(x.dd, c.d_count(), c.d);
    const std::vector<float> aux = writes_aux(c.epilogue) ? download(x.daux, c.aux_count(), c.d) : std::vector<float>{};
    std::vector<bool> inside(c.d_count(), false);
    const std::vector<float>& cm = c.out_of_place ? x.c : x.d0;
    for (int bt = 0; bt < c.batch; bt++)
      for (int j = 0; j < c.n; j++)
        for (int i = 0; i < c.m; i++) {
          double s = 0, mag = 0;
          for (int l = 0; l < c.k; l++) {
            const double av = x.a[size_t(bt * c.sa() + (c.ta ? int64_t(i) * c.lda() + l : int64_t(l) * c.lda() + i))];
            const double bv = x.b[size_t(bt * c.sb() + (c.tb ? int64_t(l) * c.ldb() + j : int64_t(j) * c.ldb() + l))];
            s += av * bv, mag += std::fabs(av * bv);
          }
          const size_t at = size_t(bt * c.sd() + int64_t(j) * c.ldd() + i);
          inside[at] = true;
          double v = c.alpha * s;
          mag *= std::fabs(c.alpha);
          if (c.beta != 0.f) v += double(c.beta) * cm[at], mag += std::fabs(double(c.beta) * cm[at]);
          if (has_bias(c.epilogue)) v += x.bias[size_t(i)], mag += std::fabs(x.bias[size_t(i)]);
          const size_t aux_at = size_t(j * c.aux_ld() + i);
          double want = v;
          if (writes_aux(c.epilogue)) {
            ASSERT_NEAR(aux[aux_at], v, eps(c.d) * std::fabs(v) + 1e-5 * mag + 1e-6)
                << "aux at batch " << bt << " (" << i << ", " << j << ")";
            want = gelu(v);
          } else if (c.epilogue == CUBLASLT_EPILOGUE_DGELU) {
            want = gelu_grad(x.aux[aux_at]) * v;
          }
          // fp32 accumulation over k terms, the epilogue's slope (at most 1.2), one rounding on store.
          const double tol = eps(c.d) * std::fabs(want) + 2e-5 * mag + 1e-6;
          ASSERT_NEAR(d[at], want, tol) << "D at batch " << bt << " (" << i << ", " << j << ")";
        }
    for (size_t i = 0; i < d.size(); i++) {
      if (inside[i] || (std::isnan(d[i]) && std::isnan(x.d0[i]))) continue;
      ASSERT_EQ(d[i], x.d0[i]) << "element " << i << " of D's allocation, outside its matrices, changed";
    }
  }
  Case random_case() {
    std::uniform_int_distribution<int> size(1, 37);
    Case c;
    c.m = size(rng_), c.n = size(rng_), c.k = size(rng_);
    return c;
  }
};

constexpr cudaDataType_t kCombos[][2] = {{CUDA_R_32F, CUDA_R_32F},  {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_16BF, CUDA_R_32F},
                                         {CUDA_R_16F, CUDA_R_16F}, {CUDA_R_16F, CUDA_R_32F}};

std::string combo_name(const Case& c) {
  return "ab=" + std::to_string(int(c.ab)) + " d=" + std::to_string(int(c.d)) + " ta=" + std::to_string(c.ta) +
         " tb=" + std::to_string(c.tb) + " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
         " k=" + std::to_string(c.k);
}

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

// ---- the project's path: mt::cuda::gemm (kernels/cuda/gemm.cu) ----

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

TEST_F(SimLt, ProjectGemmMatchesTheReferenceOnEveryPath) {
  cudaStream_t s = stream();
  const mt::ops::Ctx ctx{mt::Device::cuda, s};
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
