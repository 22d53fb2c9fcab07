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
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
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

// The matmul descriptor of one call: the transposes, the epilogue and its pointers. Made per call
// (cheap, host only), since the bias and aux pointers change from call to call.
struct LtOp {
  cublasLtMatmulDesc_t op = nullptr;
  LtOp(const Gemm& g, const Target& t, cublasLtEpilogue_t epi) {
    MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_desc(op, CUBLASLT_MATMUL_DESC_TRANSA, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    set_desc(op, CUBLASLT_MATMUL_DESC_TRANSB, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    if (epi == CUBLASLT_EPILOGUE_DEFAULT) return;
    set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
    if (g.bias && (epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS))
      set_desc(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_DGELU) {
      set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
      set_desc(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(t.ld));
    }
  }
  LtOp(const LtOp&) = delete;
  LtOp& operator=(const LtOp&) = delete;
  ~LtOp() { cublasLtMatmulDescDestroy(op); }
};

// What the heuristic answered for one GEMM configuration: the layouts (immutable once made, shared by
// every call of that configuration) and the algorithm, or that there is none.
struct LtPlan {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  LtPlan() = default;
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;
  ~LtPlan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
  }
};

// A configuration: everything the heuristic's answer depends on (device; types; shape; leading
// dimensions and batch strides; transposes; epilogue; the alignment of every operand, which the
// preference promises and the chosen algorithm relies on). Pointers themselves are not in it.
using PlanKey = std::array<int64_t, 21>;

// The plans asked so far, per process: a training step runs the same few dozen configurations every
// step, and the heuristic costs host time on each call. Like the handles above, process-wide state
// that is never destroyed; bounded, and emptied whole when full (a run with ever new shapes).
struct PlanCache {
  std::mutex mu;
  std::map<PlanKey, std::shared_ptr<const LtPlan>> plans;
};
constexpr size_t kMaxPlans = 4096;

PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache;
  return *cache;
}

// Asks the heuristic for one configuration. A configuration the library cannot serve (NOT_SUPPORTED,
// or INVALID_VALUE for a fused epilogue it cannot combine with these types or this layout) is a plan
// without an algorithm; any other failure throws and is not remembered.
std::shared_ptr<const LtPlan> make_plan(const Gemm& g, const Target& t, const LtOp& op, const uint32_t (&align)[3],
                                        cublasLtEpilogue_t epi) {
  // Workspace lets cuBLASLt pick split-K kernels; it is allocated per call, stream-ordered.
  constexpr uint64_t kMaxWorkspace = uint64_t(32) << 20;
  auto plan = std::make_shared<LtPlan>();
  make_layout(&plan->a, g.ab_type, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.stride_a, g.batch);
  make_layout(&plan->b, g.ab_type, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.stride_b, g.batch);
  make_layout(&plan->d, t.type, g.m, g.n, t.ld, t.stride, g.batch);

  struct Pref {
    cublasLtMatmulPreference_t p = nullptr;
    ~Pref() {
      if (p) cublasLtMatmulPreferenceDestroy(p);
    }
  } pref;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.p));
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kMaxWorkspace);
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]);
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]);
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]);
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]);

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle(), op.op, plan->a, plan->b, plan->d, plan->d,
                                                           pref.p, 1, &result, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_INVALID_VALUE && epi != CUBLASLT_EPILOGUE_DEFAULT))
    return plan;
  MT_CUBLAS_CHECK(st);
  plan->found = found > 0;
  plan->algo = result.algo;
  plan->workspace = result.workspaceSize;
  return plan;
}

// One cublasLtMatmul with the given epilogue, on the configuration's cached plan. Returns false, having
// launched nothing, when cuBLASLt has no algorithm for this configuration; any other failure throws.
bool lt_matmul(const Gemm& g, const Target& t, cublasLtEpilogue_t epi, cudaStream_t stream) {
  const LtOp op(g, t, epi);
  const size_t ab_size = dtype_size(g.ab_type), d_size = dtype_size(t.type);
  // C and D share one layout descriptor, so one alignment that holds for both.
  const uint32_t align[3] = {alignment_bytes(g.a, g.lda, g.stride_a, g.batch, ab_size),
                             alignment_bytes(g.b, g.ldb, g.stride_b, g.batch, ab_size),
                             std::min(alignment_bytes(t.d, t.ld, t.stride, g.batch, d_size),
                                      alignment_bytes(t.c, t.ld, t.stride, g.batch, d_size))};
  // The heuristic reads the bias and aux pointers (their alignment), so theirs is part of the key too.
  const bool batched = g.batch > 1;
  const int64_t al_bias = g.bias ? alignment_bytes(g.bias, 0, 0, 1, 1) : 0;
  const int64_t al_aux = g.aux ? alignment_bytes(g.aux, 0, 0, 1, 1) : 0;
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  const PlanKey key{dev,      int64_t(g.ab_type), int64_t(t.type), g.m,     g.n,      g.k,
                    g.batch,  g.trans_a,          g.trans_b,       g.lda,   g.ldb,    t.ld,
                    batched ? g.stride_a : 0,     batched ? g.stride_b : 0, batched ? t.stride : 0,
                    int64_t(epi), align[0],       align[1],        align[2], al_bias,  al_aux};
  PlanCache& cache = plan_cache();
  std::shared_ptr<const LtPlan> plan;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    if (auto it = cache.plans.find(key); it != cache.plans.end()) plan = it->second;
  }
  if (!plan) {
    plan = make_plan(g, t, op, align, epi);
    std::lock_guard<std::mutex> lock(cache.mu);
    if (cache.plans.size() >= kMaxPlans) cache.plans.clear();
    cache.plans.emplace(key, plan);
  }
  if (!plan->found) return false;

  // Stream-ordered workspace: safe when several streams run GEMMs at once, and the pool makes it cheap.
  const StreamTemp<char> workspace(plan->workspace, stream);
  MT_CUBLAS_CHECK(cublasLtMatmul(lt_handle(), op.op, &g.alpha, g.a, plan->a, g.b, plan->b, &t.beta, t.c, plan->d,
                                 t.d, plan->d, &plan->algo, workspace.get(), plan->workspace, stream));
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

void clear_gemm_plans() {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  cache.plans.clear();
}

}  // namespace mt::cuda
