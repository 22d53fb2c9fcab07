// What the simulated cuBLASLt's tests share (tests/test_sim_cublaslt.cpp checks the stand-in itself,
// tests/test_sim_cublaslt_gemm.cpp the project's path through it): a GEMM case in cuBLASLt's terms, its
// operands on the host and the device, the descriptors of one call, and a double-precision reference.
#pragma once
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "sim/sim.h"
#include "tests/sim_test_util.h"

namespace mt::testing::sim_lt {

using namespace mt::testing::sim;
constexpr uint64_t kMaxWorkspace = uint64_t(32) << 20;

inline size_t elem(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

inline float round_to(cudaDataType_t t, float v) {
  return t == CUDA_R_16BF ? mt::round_bf16(v) : t == CUDA_R_16F ? mt::round_f16(v) : v;
}

// The unit roundoff of a type: the rounding on store.
inline double eps(cudaDataType_t t) { return t == CUDA_R_16BF ? 0x1p-8 : t == CUDA_R_16F ? 0x1p-11 : 0x1p-24; }

inline double gelu(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
inline double gelu_grad(double x) {
  const double t = std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
}

inline bool has_bias(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
inline bool writes_aux(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
inline bool uses_aux(cublasLtEpilogue_t e) { return writes_aux(e) || e == CUBLASLT_EPILOGUE_DGELU; }

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

inline std::string combo_name(const Case& c) {
  return "ab=" + std::to_string(int(c.ab)) + " d=" + std::to_string(int(c.d)) + " ta=" + std::to_string(c.ta) +
         " tb=" + std::to_string(c.tb) + " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
         " k=" + std::to_string(c.k);
}

}  // namespace mt::testing::sim_lt
