// cuBLASLt for the simulated device: the calls kernels/cuda/gemm.cu makes, `extern "C"` with the CUDA 13
// toolkit's signatures, as the library mt_sim_cublaslt (linked in place of libcublasLt). A product runs on
// the CPU, in fp32, with the project's GEMM (mt::cpu::gemm), queued on the caller's stream like a kernel;
// every call is first checked as the library checks it, and for what a GPU would only show as a race or
// a wrong answer. What it does not implement fails naming itself: it never ignores an attribute.
//
// Implemented (cublasLt.h's names):
//   types       compute CUBLAS_COMPUTE_32F, scale CUDA_R_32F; A and B one type of CUDA_R_32F, CUDA_R_16BF,
//               CUDA_R_16F; C and D A's type or CUDA_R_32F. Anything else: NOT_SUPPORTED from the heuristic and
//               from cublasLtMatmul. C must have D's layout (a restriction of the stand-in; gemm.cu passes one
//               descriptor for both).
//   layouts     column-major; BATCH_COUNT (equal on all four), STRIDED_BATCH_OFFSET.
//   descriptor  TRANSA, TRANSB (N or T; C means T for real types), EPILOGUE, BIAS_POINTER,
//               EPILOGUE_AUX_POINTER, EPILOGUE_AUX_LD. Pointer mode host: alpha and beta are read at the call.
//   epilogues   DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU, at batch 1. In fp32, rounded once to D's type
//               (round to nearest even, runtime/dtype.h):
//                 v = alpha op(A) op(B) + beta C  (+ bias[i] for BIAS and GELU_AUX_BIAS)
//                 BIAS: D = v;  GELU_AUX(_BIAS): aux = v, D = gelu(v);  DGELU: D = gelu'(aux) v
//               gelu and gelu' are kernels/cuda/gelu.cuh's (the tanh form), as in the fallback epilogue kernel.
//               Bias and aux have D's type; bias has length m; aux's leading dimension is a multiple of 8 and
//               at least m (cublasLt.h's rule for EPILOGUE_AUX_LD), else INVALID_VALUE.
//   preference  MAX_WORKSPACE_BYTES, MIN_ALIGNMENT_{A,B,C,D}_BYTES (256 unless set, as in the library).
//
// The rules it adds where the header leaves the library's choice open:
//   alignment   cublasLt.h says only that a smaller promise excludes algorithms that need more. The stand-in's
//               one algorithm needs each operand aligned to its element size: a promise below that finds none
//               (NOT_SUPPORTED, no result), as does a bias or aux pointer (the heuristic reads their values)
//               that is not element-aligned. cublasLtMatmul then holds the caller to the promise: an operand
//               pointer less aligned than promised is INVALID_VALUE naming it. (The library checks against what
//               its chosen kernel needs, so on a GPU a false promise fails only sometimes.) A null algo runs the
//               implicit query, as the library does, promising what the pointers have.
//   workspace   1 MiB when the preference allows that much (as split-K algorithms ask for some), else none;
//               cublasLtMatmul needs at least what the heuristic reported, as device memory.
//   memory      A, B, C (when beta != 0), D, bias, aux and the workspace must be live device memory over their
//               whole extent (all batches), at the call and again when the work runs (a stream-ordered free
//               may end them in between). What the product writes (D, a written aux, the workspace) must not
//               overlap another operand, except C == D in place: on a GPU that is a race. Nor may D's batches
//               overlap each other.
//   algo        a cublasLtMatmulAlgo_t from this stand-in's heuristic for the same types, transposes and
//               epilogue, else INVALID_VALUE.
//   no algorithm MT_SIM_CUBLASLT_NO_ALGO in the environment: `epilogues`, the heuristic finds none
//               (NOT_SUPPORTED) for a problem with an epilogue; `all`, for any problem. A GPU's library may
//               refuse some shapes so; this lets the project's fallback path (its epilogue kernel, or its
//               product kernel too) run on every shape, to be compared with the fused path.
// Each failure prints one line naming the call and the argument ("simulated device: ...", as sim/errors.cpp)
// and returns cuBLAS's own status; the message is also mt::sim::last_message(). CUDA's last error is not
// touched, as the library does not touch it.
//
// The handle types point to cublasLt.h's fixed-size opaque structs. Each descriptor here is a heap object
// whose first member is that struct, so the handle is the object's address; a registry of live objects
// refuses a destroyed or foreign handle.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cuda/gelu.cuh"
#include "runtime/dtype.h"
#include "sim/sim.h"
#include "sim/state.h"

struct cublasLtContext {};  // cublasLt.h declares it without a body; a handle holds nothing here

namespace mt::sim {
namespace {

using detail::format;

// A cuBLAS failure: the status the library would return and the line that names the call and argument.
struct LtError : std::runtime_error {
  LtError(cublasStatus_t s, const std::string& message) : std::runtime_error(message), status(s) {}
  cublasStatus_t status;
};

cublasStatus_t report(cublasStatus_t status, const char* message) {
  detail::this_thread().last_message = message;
  std::fprintf(stderr, "simulated device: %s\n", message);
  return status;
}

// Runs the body of a stand-in; a check that throws becomes the returned status.
template <class F>
cublasStatus_t lt_api(F&& body) {
  try {
    body();
    return CUBLAS_STATUS_SUCCESS;
  } catch (const LtError& e) {
    return report(e.status, e.what());
  } catch (const CudaError& e) {  // require_device at the call, or enqueue on a failed device / bad stream
    return report(e.code() == cudaErrorInvalidValue ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_EXECUTION_FAILED,
                  e.what());
  } catch (const std::bad_alloc&) {
    return report(CUBLAS_STATUS_ALLOC_FAILED, "host memory exhausted");
  }
}

struct Name {
  int value;
  const char* name;
};
#define MT_NAME(x) {int(x), #x}

std::string name_of(const Name* names, size_t count, int value, const char* what) {
  for (size_t i = 0; i < count; i++)
    if (names[i].value == value) return names[i].name;
  return format("%s %d (not in cublasLt.h)", what, value);
}
#define MT_NAME_OF(table, value, what) name_of(table, std::size(table), int(value), what).c_str()

constexpr Name kStatuses[] = {
    MT_NAME(CUBLAS_STATUS_SUCCESS),         MT_NAME(CUBLAS_STATUS_NOT_INITIALIZED),
    MT_NAME(CUBLAS_STATUS_ALLOC_FAILED),    MT_NAME(CUBLAS_STATUS_INVALID_VALUE),
    MT_NAME(CUBLAS_STATUS_ARCH_MISMATCH),   MT_NAME(CUBLAS_STATUS_MAPPING_ERROR),
    MT_NAME(CUBLAS_STATUS_EXECUTION_FAILED), MT_NAME(CUBLAS_STATUS_INTERNAL_ERROR),
    MT_NAME(CUBLAS_STATUS_NOT_SUPPORTED),   MT_NAME(CUBLAS_STATUS_LICENSE_ERROR)};
constexpr Name kTypes[] = {MT_NAME(CUDA_R_32F),  MT_NAME(CUDA_R_16F),     MT_NAME(CUDA_R_16BF),
                           MT_NAME(CUDA_R_64F),  MT_NAME(CUDA_R_8I),      MT_NAME(CUDA_R_32I),
                           MT_NAME(CUDA_R_8F_E4M3), MT_NAME(CUDA_R_8F_E5M2)};
constexpr Name kLayoutAttrs[] = {
    MT_NAME(CUBLASLT_MATRIX_LAYOUT_TYPE),        MT_NAME(CUBLASLT_MATRIX_LAYOUT_ORDER),
    MT_NAME(CUBLASLT_MATRIX_LAYOUT_ROWS),        MT_NAME(CUBLASLT_MATRIX_LAYOUT_COLS),
    MT_NAME(CUBLASLT_MATRIX_LAYOUT_LD),          MT_NAME(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT),
    MT_NAME(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET), MT_NAME(CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET),
    MT_NAME(CUBLASLT_MATRIX_LAYOUT_BATCH_MODE)};
constexpr Name kDescAttrs[] = {
    MT_NAME(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE), MT_NAME(CUBLASLT_MATMUL_DESC_SCALE_TYPE),
    MT_NAME(CUBLASLT_MATMUL_DESC_POINTER_MODE), MT_NAME(CUBLASLT_MATMUL_DESC_TRANSA),
    MT_NAME(CUBLASLT_MATMUL_DESC_TRANSB), MT_NAME(CUBLASLT_MATMUL_DESC_TRANSC),
    MT_NAME(CUBLASLT_MATMUL_DESC_FILL_MODE), MT_NAME(CUBLASLT_MATMUL_DESC_EPILOGUE),
    MT_NAME(CUBLASLT_MATMUL_DESC_BIAS_POINTER), MT_NAME(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE),
    MT_NAME(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER), MT_NAME(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD),
    MT_NAME(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE), MT_NAME(CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE),
    MT_NAME(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), MT_NAME(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER),
    MT_NAME(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER), MT_NAME(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER),
    MT_NAME(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER), MT_NAME(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER),
    MT_NAME(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE), MT_NAME(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER),
    MT_NAME(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER), MT_NAME(CUBLASLT_MATMUL_DESC_FAST_ACCUM),
    MT_NAME(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), MT_NAME(CUBLASLT_MATMUL_DESC_A_SCALE_MODE),
    MT_NAME(CUBLASLT_MATMUL_DESC_B_SCALE_MODE), MT_NAME(CUBLASLT_MATMUL_DESC_C_SCALE_MODE),
    MT_NAME(CUBLASLT_MATMUL_DESC_D_SCALE_MODE), MT_NAME(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE),
    MT_NAME(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER), MT_NAME(CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE),
    MT_NAME(CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR)};
constexpr Name kPrefAttrs[] = {
    MT_NAME(CUBLASLT_MATMUL_PREF_SEARCH_MODE), MT_NAME(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES),
    MT_NAME(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK), MT_NAME(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES),
    MT_NAME(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES), MT_NAME(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES),
    MT_NAME(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES), MT_NAME(CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT),
    MT_NAME(CUBLASLT_MATMUL_PREF_IMPL_MASK)};
constexpr Name kEpilogues[] = {
    MT_NAME(CUBLASLT_EPILOGUE_DEFAULT),   MT_NAME(CUBLASLT_EPILOGUE_RELU),       MT_NAME(CUBLASLT_EPILOGUE_RELU_AUX),
    MT_NAME(CUBLASLT_EPILOGUE_BIAS),      MT_NAME(CUBLASLT_EPILOGUE_RELU_BIAS),  MT_NAME(CUBLASLT_EPILOGUE_RELU_AUX_BIAS),
    MT_NAME(CUBLASLT_EPILOGUE_DRELU),     MT_NAME(CUBLASLT_EPILOGUE_DRELU_BGRAD), MT_NAME(CUBLASLT_EPILOGUE_GELU),
    MT_NAME(CUBLASLT_EPILOGUE_GELU_AUX),  MT_NAME(CUBLASLT_EPILOGUE_GELU_BIAS),  MT_NAME(CUBLASLT_EPILOGUE_GELU_AUX_BIAS),
    MT_NAME(CUBLASLT_EPILOGUE_DGELU),     MT_NAME(CUBLASLT_EPILOGUE_DGELU_BGRAD), MT_NAME(CUBLASLT_EPILOGUE_BGRADA),
    MT_NAME(CUBLASLT_EPILOGUE_BGRADB)};

// ---- the objects behind the handles ----

struct Layout {
  cublasLtMatrixLayoutOpaque_t opaque{};  // first: the handle is its address
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;  // elements
};
struct Desc {
  cublasLtMatmulDescOpaque_t opaque{};
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
};
struct Pref {
  cublasLtMatmulPreferenceOpaque_t opaque{};
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};
static_assert(std::is_standard_layout_v<Layout> && std::is_standard_layout_v<Desc> && std::is_standard_layout_v<Pref>);

// The live objects, by handle, with what each is: the library is process-wide state, so this is too.
struct Registry {
  std::mutex mu;
  std::map<const void*, const char*> live;  // handle -> its kind's name
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: a static destructor may still destroy a handle
  return *r;
}
template <class T> const char* kind_name();
template <> const char* kind_name<cublasLtContext>() { return "cuBLASLt handle"; }
template <> const char* kind_name<Layout>() { return "matrix layout"; }
template <> const char* kind_name<Desc>() { return "matmul descriptor"; }
template <> const char* kind_name<Pref>() { return "matmul preference"; }

template <class T, class H>
void create(H* out, const char* call, T* obj) {
  if (!out) {
    delete obj;
    throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: the output pointer is null", call));
  }
  std::lock_guard lock(registry().mu);
  registry().live[obj] = kind_name<T>();
  *out = reinterpret_cast<H>(obj);
}

// The object behind a handle, which must be a live one of its kind (a bad cuBLASLt handle is
// NOT_INITIALIZED, a bad descriptor INVALID_VALUE, as the library answers).
template <class T>
T& object(const void* h, const char* call, const char* what) {
  std::lock_guard lock(registry().mu);
  auto it = registry().live.find(h);
  if (it == registry().live.end() || it->second != kind_name<T>())
    throw LtError(std::is_same_v<T, cublasLtContext> ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_INVALID_VALUE,
                  format("%s: %s = %p is not a live %s (destroyed, or never created)", call, what, h, kind_name<T>()));
  return *static_cast<T*>(const_cast<void*>(h));
}

template <class T>
void destroy(const void* h, const char* call) {
  if (!h && !std::is_same_v<T, cublasLtContext>) return;  // like free(NULL)
  T* obj = &object<T>(h, call, "the handle");
  std::lock_guard lock(registry().mu);
  registry().live.erase(h);
  delete obj;
}

// Copies an attribute's value after checking its size against the attribute's type.
template <class V>
void set_value(V& field, const void* buf, size_t size, const char* call, const char* attr, const char* type) {
  if (!buf) throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: %s: buf is null", call, attr));
  if (size != sizeof(V))
    throw LtError(CUBLAS_STATUS_INVALID_VALUE,
                  format("%s: %s takes %zu bytes (%s), given sizeInBytes = %zu", call, attr, sizeof(V), type, size));
  std::memcpy(&field, buf, sizeof(V));
}

[[noreturn]] void not_simulated(const char* call, const char* attr) {
  throw LtError(CUBLAS_STATUS_NOT_SUPPORTED, format("%s: %s is not simulated", call, attr));
}

std::atomic<uint64_t>& heuristic_calls() {
  static std::atomic<uint64_t> calls{0};
  return calls;
}

// ---- the problem a descriptor and four layouts describe ----

size_t elem_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
bool is_16bit(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_16F; }
bool has_bias(uint32_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool writes_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
bool reads_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_DGELU; }

size_t extent_bytes(const Layout& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  return ((uint64_t(l.batch) - 1) * uint64_t(l.stride) + (l.cols - 1) * uint64_t(l.ld) + l.rows) * elem_size(l.type);
}

// Copies, so that queued work outlives the caller's descriptors (the library copies them too).
struct Problem {
  Layout a, b, c, d;
  Desc op;
  uint64_t m = 0, n = 0, k = 0;
};

uint64_t fingerprint(const Problem& p) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : {int64_t(p.op.compute), int64_t(p.op.scale), int64_t(p.a.type), int64_t(p.d.type),
                    int64_t(p.op.transa), int64_t(p.op.transb), int64_t(p.op.epilogue)})
    h = (h ^ uint64_t(v)) * 1099511628211ull;
  return h;
}

Problem check_problem(const char* call, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                      cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D) {
  Problem p{object<Layout>(A, call, "Adesc"), object<Layout>(B, call, "Bdesc"), object<Layout>(C, call, "Cdesc"),
            object<Layout>(D, call, "Ddesc"), object<Desc>(op, call, "computeDesc")};
  const auto type = [](cudaDataType_t t) { return name_of(kTypes, std::size(kTypes), int(t), "cudaDataType_t"); };
  if (p.op.compute != CUBLAS_COMPUTE_32F || p.op.scale != CUDA_R_32F)
    throw LtError(CUBLAS_STATUS_NOT_SUPPORTED,
                  format("%s: compute type %d with scale type %s is not simulated (only CUBLAS_COMPUTE_32F with "
                         "CUDA_R_32F)", call, int(p.op.compute), type(p.op.scale).c_str()));
  const bool ab_ok = p.a.type == p.b.type && (p.a.type == CUDA_R_32F || is_16bit(p.a.type));
  const bool cd_ok = p.c.type == p.d.type && (p.d.type == p.a.type || p.d.type == CUDA_R_32F);
  if (!ab_ok || !cd_ok)
    throw LtError(CUBLAS_STATUS_NOT_SUPPORTED,
                  format("%s: A %s, B %s, C %s, D %s is not a supported type combination (A = B in CUDA_R_32F, "
                         "CUDA_R_16BF, CUDA_R_16F; C = D in A's type or CUDA_R_32F)",
                         call, type(p.a.type).c_str(), type(p.b.type).c_str(), type(p.c.type).c_str(),
                         type(p.d.type).c_str()));
  const Layout &c = p.c, &d = p.d;
  if (c.rows != d.rows || c.cols != d.cols || c.ld != d.ld || c.batch != d.batch || c.stride != d.stride)
    throw LtError(CUBLAS_STATUS_NOT_SUPPORTED, format("%s: Cdesc differs from Ddesc (the stand-in takes C in D's "
                                                      "layout only)", call));
  for (const auto& [l, name] : {std::pair{&p.a, "Adesc"}, {&p.b, "Bdesc"}, {&p.d, "Ddesc"}}) {
    if (l->ld < 0 || uint64_t(l->ld) < l->rows)
      throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: %s: ld %lld is less than its %llu rows", call, name,
                                                        (long long)l->ld, (unsigned long long)l->rows));
    if (l->rows > INT32_MAX || l->cols > INT32_MAX || l->ld > INT32_MAX)
      throw LtError(CUBLAS_STATUS_NOT_SUPPORTED, format("%s: %s: sizes beyond int32 are not simulated", call, name));
    if (l->batch != d.batch)
      throw LtError(CUBLAS_STATUS_INVALID_VALUE,
                    format("%s: %s has batch count %d, Ddesc %d", call, name, int(l->batch), int(d.batch)));
    if (l->stride < 0)
      throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: %s: negative batch stride %lld", call, name,
                                                        (long long)l->stride));
  }
  const bool ta = p.op.transa != CUBLAS_OP_N, tb = p.op.transb != CUBLAS_OP_N;
  p.m = d.rows, p.n = d.cols, p.k = ta ? p.a.rows : p.a.cols;
  const uint64_t a_m = ta ? p.a.cols : p.a.rows, b_k = tb ? p.b.cols : p.b.rows, b_n = tb ? p.b.rows : p.b.cols;
  if (a_m != p.m || b_k != p.k || b_n != p.n)
    throw LtError(CUBLAS_STATUS_INVALID_VALUE,
                  format("%s: op(A) is %llu x %llu and op(B) %llu x %llu, but D is %llu x %llu", call,
                         (unsigned long long)a_m, (unsigned long long)p.k, (unsigned long long)b_k,
                         (unsigned long long)b_n, (unsigned long long)p.m, (unsigned long long)p.n));
  // D's batches must not share an element: either each lies past the previous one's last element, or
  // they interleave within the columns (batch b in rows [b stride, b stride + rows) of a wider matrix, as
  // attention's heads do). A layout between the two is refused as overlapping.
  const uint64_t d_span = (d.cols - 1) * uint64_t(d.ld) + d.rows;
  const bool d_apart = uint64_t(d.stride) >= d_span;
  const bool d_interleaved = uint64_t(d.stride) >= d.rows && (d.batch - 1) * uint64_t(d.stride) + d.rows <= uint64_t(d.ld);
  if (d.batch > 1 && d.rows && d.cols && !d_apart && !d_interleaved)
    throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: Ddesc: batch stride %lld makes D's batches overlap", call,
                                                      (long long)d.stride));
  const uint32_t e = p.op.epilogue;
  if (e != CUBLASLT_EPILOGUE_DEFAULT && d.batch > 1)
    throw LtError(CUBLAS_STATUS_NOT_SUPPORTED, format("%s: %s with batch count %d is not simulated (batch 1 only)",
                                                      call, MT_NAME_OF(kEpilogues, e, "epilogue"), int(d.batch)));
  if ((writes_aux(e) || reads_aux(e)) && (p.op.aux_ld % 8 != 0 || p.op.aux_ld < int64_t(p.m)))
    throw LtError(CUBLAS_STATUS_INVALID_VALUE,
                  format("%s: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = %lld must be a multiple of 8 and at least m = "
                         "%llu", call, (long long)p.op.aux_ld, (unsigned long long)p.m));
  return p;
}

constexpr const char* kOperand[4] = {"A", "B", "C", "D"};
constexpr uint64_t kAlgoTag = 0x6d742d73696d4c74ull;  // "mt-simLt"
constexpr uint64_t kWorkspace = uint64_t(1) << 20;

uint32_t alignment_of(const void* p) {
  const uintptr_t a = uintptr_t(p) | 256;
  return uint32_t(a & (~a + 1));
}

// The bias and aux pointers the epilogue uses must be aligned to D's elements: the heuristic reads them.
void check_epilogue_pointers(const char* call, const Problem& p) {
  const size_t d_size = elem_size(p.d.type);
  const uint32_t e = p.op.epilogue;
  const std::pair<const void*, const char*> used[2] = {
      {has_bias(e) ? p.op.bias : nullptr, "BIAS_POINTER"},
      {writes_aux(e) || reads_aux(e) ? p.op.aux : nullptr, "EPILOGUE_AUX_POINTER"}};
  for (const auto& [ptr, name] : used)
    if (uintptr_t(ptr) % d_size)
      throw LtError(CUBLAS_STATUS_NOT_SUPPORTED,
                    format("%s: no algorithm: %s = %p is not aligned to D's %zu-byte elements", call, name, ptr, d_size));
}

// The heuristic: one algorithm when every promise covers the element sizes, else none.
cublasLtMatmulAlgo_t find_algo(const char* call, const Problem& p, const uint32_t (&align)[4],
                               uint64_t max_workspace, size_t* workspace) {
  if (const char* v = std::getenv("MT_SIM_CUBLASLT_NO_ALGO"); v && *v) {
    const bool all = std::strcmp(v, "all") == 0;
    if (!all && std::strcmp(v, "epilogues") != 0)
      throw LtError(CUBLAS_STATUS_INVALID_VALUE,
                    format("%s: MT_SIM_CUBLASLT_NO_ALGO=%s: expected `epilogues` or `all`", call, v));
    if (all || p.op.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
      throw LtError(CUBLAS_STATUS_NOT_SUPPORTED,
                    format("%s: no algorithm: MT_SIM_CUBLASLT_NO_ALGO=%s", call, v));
  }
  const Layout* layouts[4] = {&p.a, &p.b, &p.c, &p.d};
  for (int i = 0; i < 4; i++)
    if (align[i] < elem_size(layouts[i]->type))
      throw LtError(CUBLAS_STATUS_NOT_SUPPORTED,
                    format("%s: no algorithm: MIN_ALIGNMENT_%s_BYTES = %u is less than the %zu-byte elements of %s",
                           call, kOperand[i], align[i], elem_size(layouts[i]->type), kOperand[i]));
  check_epilogue_pointers(call, p);
  cublasLtMatmulAlgo_t algo{};
  *workspace = max_workspace >= kWorkspace ? kWorkspace : 0;
  algo.data[0] = kAlgoTag;
  algo.data[1] = fingerprint(p);
  algo.data[2] = *workspace;
  for (int i = 0; i < 4; i++) algo.data[3 + i] = align[i];
  return algo;
}

// ---- the product ----

float load(const void* base, cudaDataType_t t, size_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(base)[i];
  const uint16_t h = static_cast<const uint16_t*>(base)[i];
  return t == CUDA_R_16BF ? bf16_to_f32(h) : f16_to_f32(h);
}

void store(void* base, cudaDataType_t t, size_t i, float v) {
  if (t == CUDA_R_32F)
    static_cast<float*>(base)[i] = v;
  else
    static_cast<uint16_t*>(base)[i] = t == CUDA_R_16BF ? f32_to_bf16(v) : f32_to_f16(v);
}

// Batch `b` of a matrix as fp32 for the CPU GEMM: fp32 in place, 16-bit converted (exactly) into `buf`.
const float* as_f32(const void* p, const Layout& l, int64_t b, std::vector<float>& buf, int* ld) {
  const size_t base = size_t(b) * size_t(l.stride);
  if (l.type == CUDA_R_32F) {
    *ld = int(l.ld);
    return static_cast<const float*>(p) + base;
  }
  buf.resize(l.rows * l.cols);
  for (uint64_t j = 0; j < l.cols; j++)
    for (uint64_t i = 0; i < l.rows; i++) buf[j * l.rows + i] = load(p, l.type, base + j * uint64_t(l.ld) + i);
  *ld = int(l.rows);
  return buf.data();
}

struct Operands {
  const void *a, *b, *c;
  void* d;
  float alpha, beta;
};

void run_product(const Problem& p, const Operands& o) {
  const int m = int(p.m), n = int(p.n), k = int(p.k);
  const Layout& d = p.d;
  const uint32_t e = p.op.epilogue;
  std::vector<float> x(size_t(m) * size_t(n)), a_buf, b_buf;
  for (int64_t bt = 0; bt < d.batch; bt++) {
    // Column-major D (m x n) is row-major D^T (n x m): D^T = op(B)^T op(A)^T, the transposes passing through.
    if (k == 0) {
      std::fill(x.begin(), x.end(), 0.f);
    } else {
      int lda = 0, ldb = 0;
      const float* a = as_f32(o.a, p.a, bt, a_buf, &lda);
      const float* b = as_f32(o.b, p.b, bt, b_buf, &ldb);
      cpu::gemm<float>(p.op.transb != CUBLAS_OP_N, p.op.transa != CUBLAS_OP_N, n, m, k, o.alpha, b, ldb, a, lda, 0.f,
                       x.data(), m);
    }
    for (int j = 0; j < n; j++)
      for (int i = 0; i < m; i++) {
        const size_t at = size_t(bt) * size_t(d.stride) + size_t(j) * size_t(d.ld) + size_t(i);
        float v = x[size_t(j) * size_t(m) + size_t(i)];
        if (o.beta != 0.f) v += o.beta * load(o.c, d.type, at);  // beta == 0: C is not read
        if (has_bias(e)) v += load(p.op.bias, d.type, size_t(i));
        const size_t aux_at = size_t(j) * size_t(p.op.aux_ld) + size_t(i);
        if (writes_aux(e)) {
          store(p.op.aux, d.type, aux_at, v);
          v = cuda::gelu(v);
        } else if (reads_aux(e)) {
          v = cuda::gelu_grad(load(p.op.aux, d.type, aux_at)) * v;
        }
        store(o.d, d.type, at, v);
      }
  }
}

struct Range {
  const char* name;
  uintptr_t begin, end;
  bool written;
};

// The memory one product touches, each operand over its whole extent: checked to be live device memory,
// and no written range may overlap another (C == D in place is one range).
std::vector<Range> operand_ranges(const char* call, const Problem& p, const Operands& o, const void* workspace,
                                  size_t workspace_bytes) {
  const uint32_t e = p.op.epilogue;
  const std::string epilogue = MT_NAME_OF(kEpilogues, e, "epilogue");
  if (has_bias(e) && !p.op.bias)
    throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: %s without BIAS_POINTER", call, epilogue.c_str()));
  if ((writes_aux(e) || reads_aux(e)) && !p.op.aux)
    throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: %s without EPILOGUE_AUX_POINTER", call, epilogue.c_str()));
  std::vector<Range> ranges;
  const auto add = [&](const char* name, const void* ptr, size_t bytes, bool written) {
    if (!ptr) throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: %s is null", call, name));
    ranges.push_back({name, uintptr_t(ptr), uintptr_t(ptr) + bytes, written});
  };
  if (p.k > 0) add("A", o.a, extent_bytes(p.a), false), add("B", o.b, extent_bytes(p.b), false);
  if (o.beta != 0.f && o.c != o.d) add("C", o.c, extent_bytes(p.c), false);
  add("D", o.d, extent_bytes(p.d), true);
  const size_t d_size = elem_size(p.d.type);
  if (has_bias(e)) add("bias", p.op.bias, p.m * d_size, false);
  if (writes_aux(e) || reads_aux(e))
    add("aux", p.op.aux, ((p.n - 1) * uint64_t(p.op.aux_ld) + p.m) * d_size, writes_aux(e));
  if (workspace_bytes > 0) add("workspace", workspace, workspace_bytes, true);
  for (const Range& r : ranges) require_device(reinterpret_cast<const void*>(r.begin), r.end - r.begin, call, r.name);
  for (const Range& w : ranges)
    for (const Range& r : ranges)
      if (w.written && &w != &r && w.begin < r.end && r.begin < w.end && (!r.written || &r < &w))
        throw LtError(CUBLAS_STATUS_INVALID_VALUE,
                      format("%s: %s and %s overlap (a race on the device)", call, w.name, r.name));
  return ranges;
}

// The alignments the algorithm was chosen for: what the preference promised for A, B, C and D, and
// element alignment for the bias and aux pointers (which may have changed since the query).
void check_promises(const char* call, const Problem& p, const Operands& o, const cublasLtMatmulAlgo_t& algo) {
  const void* ptrs[4] = {p.k > 0 ? o.a : nullptr, p.k > 0 ? o.b : nullptr, o.beta != 0.f ? o.c : nullptr, o.d};
  for (int i = 0; i < 4; i++)
    if (uintptr_t(ptrs[i]) % algo.data[3 + i])
      throw LtError(CUBLAS_STATUS_INVALID_VALUE,
                    format("%s: %s = %p is %u-byte aligned, less than the %llu bytes MIN_ALIGNMENT_%s_BYTES promised",
                           call, kOperand[i], ptrs[i], alignment_of(ptrs[i]), (unsigned long long)algo.data[3 + i],
                           kOperand[i]));
  check_epilogue_pointers(call, p);
}

}  // namespace

uint64_t lt_heuristic_calls() { return heuristic_calls().load(); }

}  // namespace mt::sim

using namespace mt::sim;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  return lt_api([&] { create(lightHandle, "cublasLtCreate", new cublasLtContext); });
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  return lt_api([&] { destroy<cublasLtContext>(lightHandle, "cublasLtDestroy"); });
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  for (const Name& s : kStatuses)
    if (s.value == int(status)) return s.name;
  return "unrecognized cuBLAS status";
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  return lt_api([&] {
    auto* l = new Layout;
    l->type = type, l->rows = rows, l->cols = cols, l->ld = ld;
    create(matLayout, "cublasLtMatrixLayoutCreate", l);
  });
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  return lt_api([&] { destroy<Layout>(matLayout, "cublasLtMatrixLayoutDestroy"); });
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t sizeInBytes) {
  return lt_api([&] {
    const char* call = "cublasLtMatrixLayoutSetAttribute";
    Layout& l = object<Layout>(matLayout, call, "matLayout");
    const std::string attr_name = MT_NAME_OF(kLayoutAttrs, attr, "attribute");
    const char* name = attr_name.c_str();
    switch (attr) {
      case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: {
        int32_t count = 0;
        set_value(count, buf, sizeInBytes, call, name, "int32_t");
        if (count < 1) throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: %s = %d", call, name, int(count)));
        l.batch = count;
        break;
      }
      case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: set_value(l.stride, buf, sizeInBytes, call, name, "int64_t"); break;
      default: not_simulated(call, name);
    }
  });
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
  return lt_api([&] {
    auto* d = new Desc;
    d->compute = computeType, d->scale = scaleType;
    create(matmulDesc, "cublasLtMatmulDescCreate", d);
  });
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  return lt_api([&] { destroy<Desc>(matmulDesc, "cublasLtMatmulDescDestroy"); });
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
  return lt_api([&] {
    const char* call = "cublasLtMatmulDescSetAttribute";
    Desc& d = object<Desc>(matmulDesc, call, "matmulDesc");
    const std::string attr_name = MT_NAME_OF(kDescAttrs, attr, "attribute");
    const char* name = attr_name.c_str();
    switch (attr) {
      case CUBLASLT_MATMUL_DESC_TRANSA:
      case CUBLASLT_MATMUL_DESC_TRANSB: {
        int32_t op = 0;
        set_value(op, buf, sizeInBytes, call, name, "int32_t");
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C)
          throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: %s = %d is not a cublasOperation_t", call, name, op));
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d.transa : d.transb) = op;
        break;
      }
      case CUBLASLT_MATMUL_DESC_EPILOGUE: {
        uint32_t e = 0;
        set_value(e, buf, sizeInBytes, call, name, "uint32_t");
        if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS && !writes_aux(e) && !reads_aux(e))
          throw LtError(CUBLAS_STATUS_NOT_SUPPORTED,
                        format("%s: %s = %s is not simulated", call, name, MT_NAME_OF(kEpilogues, e, "epilogue")));
        d.epilogue = e;
        break;
      }
      case CUBLASLT_MATMUL_DESC_BIAS_POINTER: set_value(d.bias, buf, sizeInBytes, call, name, "const void*"); break;
      case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: set_value(d.aux, buf, sizeInBytes, call, name, "void*"); break;
      case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: set_value(d.aux_ld, buf, sizeInBytes, call, name, "int64_t"); break;
      default: not_simulated(call, name);
    }
  });
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return lt_api([&] { create(pref, "cublasLtMatmulPreferenceCreate", new Pref); });
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return lt_api([&] { destroy<Pref>(pref, "cublasLtMatmulPreferenceDestroy"); });
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes) {
  return lt_api([&] {
    const char* call = "cublasLtMatmulPreferenceSetAttribute";
    Pref& p = object<Pref>(pref, call, "pref");
    const std::string attr_name = MT_NAME_OF(kPrefAttrs, attr, "attribute");
    const char* name = attr_name.c_str();
    switch (attr) {
      case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: set_value(p.max_workspace, buf, sizeInBytes, call, name, "uint64_t"); break;
      case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        set_value(p.align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, sizeInBytes, call, name, "uint32_t");
        break;
      default: not_simulated(call, name);
    }
  });
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
  if (returnAlgoCount) *returnAlgoCount = 0;
  heuristic_calls().fetch_add(1);
  return lt_api([&] {
    const char* call = "cublasLtMatmulAlgoGetHeuristic";
    object<cublasLtContext>(lightHandle, call, "lightHandle");
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount)
      throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: requestedAlgoCount = %d, heuristicResultsArray = %p, "
                                                        "returnAlgoCount = %p: a count >= 1 and both arrays needed",
                                                        call, requestedAlgoCount, (void*)heuristicResultsArray,
                                                        (void*)returnAlgoCount));
    const Problem p = check_problem(call, operationDesc, Adesc, Bdesc, Cdesc, Ddesc);
    const Pref& pref = object<Pref>(preference, call, "preference");
    cublasLtMatmulHeuristicResult_t r{};
    r.algo = find_algo(call, p, pref.align, pref.max_workspace, &r.workspaceSize);
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.f;
    heuristicResultsArray[0] = r;
    *returnAlgoCount = 1;
  });
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
  return lt_api([&] {
    const char* call = "cublasLtMatmul";
    object<cublasLtContext>(lightHandle, call, "lightHandle");
    const Problem p = check_problem(call, computeDesc, Adesc, Bdesc, Cdesc, Ddesc);
    cublasLtMatmulAlgo_t implicit;
    if (!algo) {  // the library's implicit query, with default preferences, sees the pointers
      const uint32_t have[4] = {alignment_of(A), alignment_of(B), alignment_of(C), alignment_of(D)};
      size_t unused = 0;
      implicit = find_algo(call, p, have, 0, &unused);
      algo = &implicit;
    }
    if (algo->data[0] != kAlgoTag || algo->data[1] != fingerprint(p))
      throw LtError(CUBLAS_STATUS_INVALID_VALUE,
                    format("%s: algo did not come from cublasLtMatmulAlgoGetHeuristic for these types, transposes "
                           "and epilogue", call));
    float scalars[2];
    for (int i = 0; i < 2; i++) {
      const void* s = i == 0 ? alpha : beta;
      const char* name = i == 0 ? "alpha" : "beta";
      if (!s) throw LtError(CUBLAS_STATUS_INVALID_VALUE, format("%s: %s is null", call, name));
      if (is_device(s, 0))
        throw LtError(CUBLAS_STATUS_INVALID_VALUE,
                      format("%s: %s = %p is device memory; the pointer mode is host (POINTER_MODE is not simulated)",
                             call, name, s));
      std::memcpy(&scalars[i], s, sizeof(float));
    }
    const Operands o{A, B, C, D, scalars[0], scalars[1]};
    if (workspaceSizeInBytes < algo->data[2])
      throw LtError(CUBLAS_STATUS_INVALID_VALUE,
                    format("%s: workspaceSizeInBytes = %zu is less than the %llu bytes the algorithm needs", call,
                           workspaceSizeInBytes, (unsigned long long)algo->data[2]));
    if (p.m == 0 || p.n == 0) return;
    const std::vector<Range> ranges = operand_ranges(call, p, o, workspace, workspaceSizeInBytes);
    check_promises(call, p, o, *algo);
    const std::string what = format("cublasLtMatmul (m=%llu n=%llu k=%llu batch=%d, %s)", (unsigned long long)p.m,
                                    (unsigned long long)p.n, (unsigned long long)p.k, int(p.d.batch),
                                    MT_NAME_OF(kEpilogues, p.op.epilogue, "epilogue"));
    enqueue(stream, what, [p, o, ranges, what] {
      // A stream-ordered free may have ended an operand since the call: an illegal address now.
      for (const Range& r : ranges)
        require_device(reinterpret_cast<const void*>(r.begin), r.end - r.begin, what.c_str(), r.name);
      run_product(p, o);
    });
  });
}

}  // extern "C"
