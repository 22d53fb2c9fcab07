// The cuBLASLt GEMM helper (gemm.cuh): descriptors, the algorithm heuristic, fused epilogues and their
// fallback kernel.
//
// cuBLASLt rules this file relies on (cublasLt.h, cublasLtMatmulDescAttributes_t):
//  - type combination: compute CUBLAS_COMPUTE_32F, scale CUDA_R_32F, A = B in {32F, 16BF, 16F} and
//    C = D in {A's type, 32F}. C and D share one layout descriptor here; C is D itself (beta reads
//    D's old contents) or, out of place, the caller's separate matrix (Gemm::c, a residual).
//  - BIAS epilogue: the bias vector has D's type by default (BIAS_DATA_TYPE left unset), length m.
//  - GELU_AUX(_BIAS) / DGELU: the aux matrix has D's type by default (EPILOGUE_AUX_DATA_TYPE unset);
//    its leading dimension (EPILOGUE_AUX_LD) must be a multiple of 8 and at least m. The bias and aux
//    pointers are set before the heuristic, which reads their values to decide alignment.
//  - operands are assumed 256-byte aligned unless the preference says otherwise, so the true
//    alignment of every operand (pointer, leading dimension and batch stride) is passed in.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemm_kernels.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/cuda/stream_temp.cuh"

namespace mt::cuda {
namespace {

using namespace gemm_kernels;

// One cuBLASLt handle per device for the whole process, created on first use. ops::Ctx carries only a
// device and a stream, and a cuBLASLt handle holds neither stream nor workspace (both are passed per
// call), so one handle per device is safe to share between threads and streams; creating one per call
// would cost milliseconds. This function-local cache is the backend's only process-wide state. Handles
// are never destroyed on purpose: a static destructor may run after the CUDA runtime has shut down.
cublasLtHandle_t lt_handle() {
  static std::mutex mu;
  static std::vector<cublasLtHandle_t> handles;
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (size_t(dev) >= handles.size()) handles.resize(size_t(dev) + 1, nullptr);
  if (!handles[size_t(dev)]) MT_CUBLAS_CHECK(cublasLtCreate(&handles[size_t(dev)]));
  return handles[size_t(dev)];
}

// The descriptors of one cuBLASLt call, released even when a check throws half-way.
struct LtCall {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtCall() = default;
  LtCall(const LtCall&) = delete;
  LtCall& operator=(const LtCall&) = delete;
  ~LtCall() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Largest power of two (<= 256) dividing the byte address of every matrix in the batch and of every
// column start. Attention hands cuBLASLt sub-views of qkv whose columns start at any element.
uint32_t alignment_bytes(const void* p, int ld, int64_t stride, int batch, size_t elem) {
  uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(p)) | (uint64_t(ld) * elem) | 256u;
  if (batch > 1) bits |= uint64_t(stride) * elem;
  return uint32_t(bits & (~bits + 1));  // lowest set bit
}

void make_layout(cublasLtMatrixLayout_t* layout, DType type, int rows, int cols, int ld, int64_t stride, int batch) {
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, cuda_type_of(type), uint64_t(rows), uint64_t(cols), int64_t(ld)));
  if (batch > 1) {
    int32_t count = batch;
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                     sizeof(count)));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                     &stride, sizeof(stride)));
  }
}

template <class T>
void set_desc(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const T& value) {
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof(value)));
}

template <class T>
void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

// Where one cuBLASLt call writes: D itself, or the fp32 temporary of the fallback path. C (read when
// beta != 0) shares D's type and layout: D itself, or the caller's separate matrix.
struct Target {
  void* d;
  DType type;
  int ld;
  int64_t stride;
  float beta;
  const void* c;
};

// One cublasLtMatmul with the given epilogue. Returns false, having launched nothing, when cuBLASLt has
// no algorithm for this configuration; any other failure throws.
bool lt_matmul(const Gemm& g, const Target& t, cublasLtEpilogue_t epi, cudaStream_t stream) {
  // Workspace lets cuBLASLt pick split-K kernels; it is allocated per call, stream-ordered.
  constexpr uint64_t kMaxWorkspace = uint64_t(32) << 20;
  LtCall call;
  make_layout(&call.a, g.ab_type, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.stride_a, g.batch);
  make_layout(&call.b, g.ab_type, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.stride_b, g.batch);
  make_layout(&call.d, t.type, g.m, g.n, t.ld, t.stride, g.batch);

  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&call.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  set_desc(call.op, CUBLASLT_MATMUL_DESC_TRANSA, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_desc(call.op, CUBLASLT_MATMUL_DESC_TRANSB, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
    set_desc(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
    if (g.bias && (epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS))
      set_desc(call.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_DGELU) {
      set_desc(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
      set_desc(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(t.ld));
    }
  }

  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&call.pref));
  set_pref(call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kMaxWorkspace);
  const size_t ab_size = dtype_size(g.ab_type), d_size = dtype_size(t.type);
  const uint32_t al_a = alignment_bytes(g.a, g.lda, g.stride_a, g.batch, ab_size);
  const uint32_t al_b = alignment_bytes(g.b, g.ldb, g.stride_b, g.batch, ab_size);
  // C and D share one layout descriptor, so one alignment that holds for both.
  const uint32_t al_d = std::min(alignment_bytes(t.d, t.ld, t.stride, g.batch, d_size),
                                 alignment_bytes(t.c, t.ld, t.stride, g.batch, d_size));
  set_pref(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a);
  set_pref(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b);
  set_pref(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_d);
  set_pref(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d);

  cublasLtMatmulHeuristicResult_t algo{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle(), call.op, call.a, call.b, call.d, call.d,
                                                           call.pref, 1, &algo, &found);
  // An epilogue the library cannot combine with these types or this layout may be reported as
  // unsupported or as an invalid value; either way the caller falls back to the unfused path.
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_INVALID_VALUE && epi != CUBLASLT_EPILOGUE_DEFAULT))
    return false;
  MT_CUBLAS_CHECK(st);
  if (found == 0) return false;

  // Stream-ordered workspace: safe when several streams run GEMMs at once, and the pool makes it cheap.
  const StreamTemp<char> workspace(algo.workspaceSize, stream);
  MT_CUBLAS_CHECK(cublasLtMatmul(lt_handle(), call.op, &g.alpha, g.a, call.a, g.b, call.b, &t.beta, t.c, call.d, t.d,
                                 call.d, &algo.algo, workspace.get(), algo.workspaceSize, stream));
  return true;
}

template <class AB, class D>
void launch_simple_gemm(const Gemm& g, const Target& t, cudaStream_t stream) {
  const LaunchShape l = simple_gemm_shape(g.m, g.n, g.batch);
  MT_LAUNCH(l, stream, simple_gemm_kernel<AB, D>)(
      static_cast<D*>(t.d), t.ld, t.stride, t.beta, static_cast<const AB*>(g.a), g.lda, g.stride_a, g.trans_a,
      static_cast<const AB*>(g.b), g.ldb, g.stride_b, g.trans_b, g.alpha, g.m, g.n, g.k, g.batch);
  MT_CUDA_CHECK_LAUNCH();
}

void simple_gemm(const Gemm& g, const Target& t, cudaStream_t stream) {
  // The slow path must not pass unnoticed in a benchmark: say so once per process, with the shape.
  // (A one-shot diagnostic flag: the only other process-wide state besides the handle cache.)
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    std::fprintf(stderr,
                 "minitrain: warning: cuBLASLt offered no algorithm for a %s GEMM m=%d n=%d k=%d batch=%d "
                 "(lda=%d ldb=%d); using the slow built-in kernel (reported once)\n",
                 dtype_name(g.ab_type), g.m, g.n, g.k, g.batch, g.lda, g.ldb);
  const bool f32_out = t.type == DType::f32;
  if (g.ab_type == DType::bf16 && f32_out)
    launch_simple_gemm<__nv_bfloat16, float>(g, t, stream);
  else if (g.ab_type == DType::bf16)
    launch_simple_gemm<__nv_bfloat16, __nv_bfloat16>(g, t, stream);
  else if (g.ab_type == DType::f16 && f32_out)
    launch_simple_gemm<__half, float>(g, t, stream);
  else if (g.ab_type == DType::f16)
    launch_simple_gemm<__half, __half>(g, t, stream);
  else
    launch_simple_gemm<float, float>(g, t, stream);
}

template <class D>
void launch_epilogue(const Gemm& g, const float* x, cudaStream_t stream) {
  const LaunchShape l = epilogue_shape(g.m, g.n);
  const void* c = g.c ? g.c : g.d;
  MT_LAUNCH(l, stream, epilogue_kernel<D>)(
      static_cast<D*>(g.d), g.ldd, x, static_cast<const D*>(g.bias), static_cast<const D*>(c), g.beta,
      static_cast<D*>(g.aux), g.epilogue, g.m, g.n);
  MT_CUDA_CHECK_LAUNCH();
}

cublasLtEpilogue_t fused_epilogue(const Gemm& g) {
  switch (g.epilogue) {
    case Epilogue::gelu: return g.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::none: break;
  }
  return g.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

}  // namespace

void gemm(const Gemm& g, const ops::Ctx& ctx) {
  MT_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1, "gemm: bad sizes m=%d n=%d k=%d batch=%d", g.m, g.n,
           g.k, g.batch);
  MT_CHECK(g.ab_type == DType::f32 || g.ab_type == DType::bf16 || g.ab_type == DType::f16,
           "gemm: operands of type %s are not supported", dtype_name(g.ab_type));
  MT_CHECK(g.d_type == g.ab_type || g.d_type == DType::f32, "gemm: %s operands cannot produce a %s result",
           dtype_name(g.ab_type), dtype_name(g.d_type));
  // A separate C goes the epilogue's way too: its fallback kernel is the one that reads C.
  const bool fused = g.bias != nullptr || g.epilogue != Epilogue::none || g.c != nullptr;
  MT_CHECK(!fused || g.batch == 1, "gemm: bias, GELU epilogues and a separate C need batch == 1");
  MT_CHECK(g.epilogue == Epilogue::none || g.beta == 0.f, "gemm: GELU epilogues need beta == 0");
  MT_CHECK(g.epilogue == Epilogue::none || g.aux != nullptr, "gemm: a GELU epilogue needs its aux matrix");
  if (g.m == 0 || g.n == 0) return;
  MT_CHECK(g.k > 0, "gemm: empty inner dimension (k=0) is not supported");
  cudaStream_t stream = stream_of(ctx);
  const Target direct{g.d, g.d_type, g.ldd, g.stride_d, g.beta, g.c ? g.c : g.d};

  if (!fused) {
    if (!lt_matmul(g, direct, CUBLASLT_EPILOGUE_DEFAULT, stream)) simple_gemm(g, direct, stream);
    return;
  }
  // The aux leading-dimension rule is checked here: cuBLASLt may reject it only at run time.
  const bool aux_ld_ok = g.epilogue == Epilogue::none || g.ldd % 8 == 0;
  if (aux_ld_ok && lt_matmul(g, direct, fused_epilogue(g), stream)) return;

  // Fallback: the product in an fp32 temporary, then the epilogue kernel.
  const StreamTemp<float> x(size_t(g.m) * size_t(g.n), stream);
  const Target temp{x.get(), DType::f32, g.m, 0, 0.f, x.get()};
  if (!lt_matmul(g, temp, CUBLASLT_EPILOGUE_DEFAULT, stream)) simple_gemm(g, temp, stream);
  switch (g.d_type) {
    case DType::bf16: launch_epilogue<__nv_bfloat16>(g, x.get(), stream); break;
    case DType::f16: launch_epilogue<__half>(g, x.get(), stream); break;
    default: launch_epilogue<float>(g, x.get(), stream); break;
  }
}

}  // namespace mt::cuda
