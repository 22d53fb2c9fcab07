// The simulated cuBLASLt's insides, shared by its two files: cublaslt.cpp (the API: handles, attributes,
// the heuristic and the call) and cublaslt_problem.cpp (what a descriptor and four layouts describe, the
// checks the library makes on them, and the product on the CPU GEMM). Not part of the stand-in's interface.
#pragma once
#include <cublasLt.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "sim/state.h"

struct cublasLtContext {};  // cublasLt.h declares it without a body; a handle holds nothing here

namespace mt::sim::lt {

using detail::format;

// A cuBLAS failure: the status the library would return and the line that names the call and argument.
struct LtError : std::runtime_error {
  LtError(cublasStatus_t s, const std::string& message) : std::runtime_error(message), status(s) {}
  cublasStatus_t status;
};

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
Registry& registry();  // cublaslt.cpp
template <class T> const char* kind_name();
template <> inline const char* kind_name<cublasLtContext>() { return "cuBLASLt handle"; }
template <> inline const char* kind_name<Layout>() { return "matrix layout"; }
template <> inline const char* kind_name<Desc>() { return "matmul descriptor"; }
template <> inline const char* kind_name<Pref>() { return "matmul preference"; }

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
  if (it == registry().live.end() || std::strcmp(it->second, kind_name<T>()) != 0)
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

// Names from cublasLt.h for messages (cublaslt.cpp).
std::string type_name(cudaDataType_t t);
std::string epilogue_name(uint32_t e);

// ---- the problem a descriptor and four layouts describe (cublaslt_problem.cpp) ----

inline size_t elem_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
inline bool is_16bit(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_16F; }
inline bool has_bias(uint32_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
inline bool writes_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
inline bool reads_aux(uint32_t e) { return e == CUBLASLT_EPILOGUE_DGELU; }

// Copies, so that queued work outlives the caller's descriptors (the library copies them too).
struct Problem {
  Layout a, b, c, d;
  Desc op;
  uint64_t m = 0, n = 0, k = 0;
};

inline constexpr const char* kOperand[4] = {"A", "B", "C", "D"};
inline constexpr uint64_t kAlgoTag = 0x6d742d73696d4c74ull;  // "mt-simLt"
inline constexpr uint64_t kWorkspace = uint64_t(1) << 20;

struct Operands {
  const void *a, *b, *c;
  void* d;
  float alpha, beta;
};

struct Range {
  const char* name;
  uintptr_t begin, end;
  bool written;
};

size_t extent_bytes(const Layout& l);
uint64_t fingerprint(const Problem& p);
uint32_t alignment_of(const void* p);
// The layouts and descriptor behind the handles, held to the library's rules (else LtError).
Problem check_problem(const char* call, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                      cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D);
// The heuristic: one algorithm when every promise covers the element sizes, else none (LtError).
cublasLtMatmulAlgo_t find_algo(const char* call, const Problem& p, const uint32_t (&align)[4],
                               uint64_t max_workspace, size_t* workspace);
// The memory one product touches, checked live and free of overlaps among what it writes.
std::vector<Range> operand_ranges(const char* call, const Problem& p, const Operands& o, const void* workspace,
                                  size_t workspace_bytes);
// The call's pointers against the alignments the algorithm was chosen for.
void check_promises(const char* call, const Problem& p, const Operands& o, const cublasLtMatmulAlgo_t& algo);
// D = alpha op(A) op(B) + beta C, then the epilogue, on the CPU GEMM.
void run_product(const Problem& p, const Operands& o);

}  // namespace mt::sim::lt
