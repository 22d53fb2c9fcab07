// The simulated cuBLASLt's problem (cublaslt_lt.h): the checks a descriptor and four layouts must pass,
// the heuristic's one algorithm, the operands' memory, and the product on the project's CPU GEMM.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cuda/gelu.cuh"
#include "runtime/dtype.h"
#include "sim/cublaslt_lt.h"
#include "sim/sim.h"

namespace mt::sim::lt {

size_t extent_bytes(const Layout& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  return ((uint64_t(l.batch) - 1) * uint64_t(l.stride) + (l.cols - 1) * uint64_t(l.ld) + l.rows) * elem_size(l.type);
}


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
  const auto type = [](cudaDataType_t t) { return type_name(t); };
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
                                                      call, epilogue_name(e).c_str(), int(d.batch)));
  if ((writes_aux(e) || reads_aux(e)) && (p.op.aux_ld % 8 != 0 || p.op.aux_ld < int64_t(p.m)))
    throw LtError(CUBLAS_STATUS_INVALID_VALUE,
                  format("%s: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = %lld must be a multiple of 8 and at least m = "
                         "%llu", call, (long long)p.op.aux_ld, (unsigned long long)p.m));
  return p;
}


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


// The memory one product touches, each operand over its whole extent: checked to be live device memory,
// and no written range may overlap another (C == D in place is one range).
std::vector<Range> operand_ranges(const char* call, const Problem& p, const Operands& o, const void* workspace,
                                  size_t workspace_bytes) {
  const uint32_t e = p.op.epilogue;
  const std::string epilogue = epilogue_name(e).c_str();
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

}  // namespace mt::sim::lt
