// Linear layers (matmul_fwd/bwd) and the cuBLASLt GEMM helper shared with attention.
//
// A row-major (r, c) array is the column-major (c x r) matrix cuBLAS sees. With X = inp^T (IC x N),
// W = weight^T (IC x OC) and G = dout^T (OC x N) in that view:
//   matmul_fwd:  out      D (OC x N)   = W^T X   (+ bias on every column)
//   matmul_bwd:  dinp     D (IC x N)   = W G
//                dweight  D (IC x OC) += X G^T   (beta = 1: parameter gradients accumulate)
// The bias rides on cuBLASLt's BIAS epilogue when an algorithm supports it, otherwise a small kernel adds
// it. dbias is a deterministic column sum (no atomics), accumulated like every parameter gradient.
#include <cstdint>
#include <mutex>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.cuh"

namespace mt::cuda {
namespace {

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
// column start. cuBLASLt assumes 256-byte alignment unless told otherwise, and attention hands it
// sub-views of qkv whose columns start at arbitrary multiples of 4 bytes.
uint32_t alignment_bytes(const void* p, int ld, int64_t stride, int batch) {
  uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(p)) | (uint64_t(ld) * sizeof(float)) | 256u;
  if (batch > 1) bits |= uint64_t(stride) * sizeof(float);
  return uint32_t(bits & (~bits + 1));  // lowest set bit
}

void make_layout(cublasLtMatrixLayout_t* layout, int rows, int cols, int ld, int64_t stride, int batch) {
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, CUDA_R_32F, uint64_t(rows), uint64_t(cols), int64_t(ld)));
  if (batch > 1) {
    int32_t count = batch;
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                     sizeof(count)));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                     &stride, sizeof(stride)));
  }
}

// Asks the heuristic for one algorithm; false when none fits (e.g. no BIAS epilogue for this shape).
bool pick_algorithm(const Gemm& g, bool with_bias, cublasLtMatmulHeuristicResult_t* out, LtCall& call) {
  // Workspace lets cuBLASLt pick split-K kernels; it is allocated per call, stream-ordered (see gemm).
  constexpr uint64_t kMaxWorkspace = uint64_t(32) << 20;
  if (call.op) {
    cublasLtMatmulDescDestroy(call.op);
    call.op = nullptr;
  }
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&call.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (with_bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    MT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
  }
  if (!call.pref) {
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&call.pref));
    uint64_t ws = kMaxWorkspace;
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                         sizeof(ws)));
    const uint32_t al_a = alignment_bytes(g.a, g.lda, g.stride_a, g.batch);
    const uint32_t al_b = alignment_bytes(g.b, g.ldb, g.stride_b, g.batch);
    const uint32_t al_d = alignment_bytes(g.d, g.ldd, g.stride_d, g.batch);
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                         &al_a, sizeof(al_a)));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                         &al_b, sizeof(al_b)));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                         &al_d, sizeof(al_d)));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                         &al_d, sizeof(al_d)));
  }
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_handle(), call.op, call.a, call.b, call.d, call.d, call.pref, 1, out, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  MT_CUBLAS_CHECK(st);
  return found > 0;
}

// D[:, j] += bias for every column j of a column-major (m x n) matrix with leading dimension ld.
__global__ void add_bias_kernel(float* d, const float* bias, int m, int n, int ld) {
  const int64_t total = int64_t(m) * n;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = idx / m;
    const int i = int(idx - j * m);
    d[j * ld + i] += bias[i];
  }
}

// dbias[c] += sum_r x[r, c] over a row-major (R, C) matrix. A block owns 32 columns; its 32 rows of
// threads stride over R and their partials are added in row-lane order, so the sum is reproducible.
__global__ void column_sum_kernel(float* dbias, const float* x, int R, int C) {
  __shared__ float part[kWarp][kWarp + 1];
  const int c = int(blockIdx.x) * kWarp + int(threadIdx.x);
  float s = 0.f;
  if (c < C)
    for (int r = int(threadIdx.y); r < R; r += int(blockDim.y)) s += x[int64_t(r) * C + c];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.f;
    for (int y = 0; y < int(blockDim.y); y++) total += part[y][threadIdx.x];
    dbias[c] += total;
  }
}

}  // namespace

void gemm(const Gemm& g, const ops::Ctx& ctx) {
  MT_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1, "gemm: bad sizes m=%d n=%d k=%d batch=%d", g.m, g.n,
           g.k, g.batch);
  MT_CHECK(!g.bias || g.batch == 1, "gemm: a bias epilogue needs batch == 1 (got %d)", g.batch);
  if (g.m == 0 || g.n == 0) return;
  MT_CHECK(g.k > 0, "gemm: empty inner dimension (k=0) is not supported");
  cudaStream_t stream = stream_of(ctx);

  LtCall call;
  make_layout(&call.a, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.stride_a, g.batch);
  make_layout(&call.b, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.stride_b, g.batch);
  make_layout(&call.d, g.m, g.n, g.ldd, g.stride_d, g.batch);

  cublasLtMatmulHeuristicResult_t algo{};
  bool fused_bias = g.bias != nullptr && pick_algorithm(g, true, &algo, call);
  if (!fused_bias && !pick_algorithm(g, false, &algo, call))
    fail("cuBLASLt found no fp32 algorithm for m=%d n=%d k=%d batch=%d (lda=%d ldb=%d ldd=%d)", g.m, g.n, g.k,
         g.batch, g.lda, g.ldb, g.ldd);

  // Stream-ordered workspace: safe when several streams run GEMMs at once, and the pool makes it cheap.
  void* workspace = nullptr;
  if (algo.workspaceSize > 0) MT_CUDA_CHECK(cudaMallocAsync(&workspace, algo.workspaceSize, stream));
  cublasStatus_t st = cublasLtMatmul(lt_handle(), call.op, &g.alpha, g.a, call.a, g.b, call.b, &g.beta, g.d, call.d,
                                     g.d, call.d, &algo.algo, workspace, algo.workspaceSize, stream);
  if (workspace) MT_CUDA_CHECK(cudaFreeAsync(workspace, stream));
  MT_CUBLAS_CHECK(st);

  if (g.bias && !fused_bias) {
    add_bias_kernel<<<grid_for(int64_t(g.m) * g.n), kBlock, 0, stream>>>(g.d, g.bias, g.m, g.n, g.ldd);
    MT_CUDA_CHECK_LAUNCH();
  }
}

void matmul_fwd(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC,
                const ops::Ctx& ctx) {
  Gemm g;
  g.m = OC, g.n = N, g.k = IC;
  g.trans_a = true, g.a = weight, g.lda = IC;
  g.b = inp, g.ldb = IC;
  g.d = out, g.ldd = OC;
  g.bias = bias;
  gemm(g, ctx);
}

void matmul_bwd(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                const float* weight, int N, int IC, int OC, const ops::Ctx& ctx) {
  if (N == 0) return;
  if (dinp) {
    Gemm g;
    g.m = IC, g.n = N, g.k = OC;
    g.a = weight, g.lda = IC;
    g.b = dout, g.ldb = OC;
    g.d = dinp, g.ldd = IC;
    gemm(g, ctx);
  }
  if (dweight) {
    Gemm g;
    g.m = IC, g.n = OC, g.k = N;
    g.a = inp, g.lda = IC;
    g.trans_b = true, g.b = dout, g.ldb = OC;
    g.d = dweight, g.ldd = IC;
    g.beta = 1.f;  // parameter gradients accumulate
    gemm(g, ctx);
  }
  if (dbias) {
    column_sum_kernel<<<ceil_div(OC, kWarp), dim3(kWarp, kWarp), 0, stream_of(ctx)>>>(dbias, dout, N, OC);
    MT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace mt::cuda
