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

#include "runtime/dtype.h"
#include "sim/sim.h"
#include "sim/state.h"
#include "sim/cublaslt_lt.h"

namespace mt::sim {

using namespace lt;

namespace {

using detail::format;


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

}  // namespace

Registry& lt::registry() {
  static Registry* r = new Registry;  // never destroyed: a static destructor may still destroy a handle
  return *r;
}

std::string lt::type_name(cudaDataType_t t) { return name_of(kTypes, std::size(kTypes), int(t), "cudaDataType_t"); }
std::string lt::epilogue_name(uint32_t e) { return name_of(kEpilogues, std::size(kEpilogues), int(e), "epilogue"); }

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
