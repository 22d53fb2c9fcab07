// Linear layer, weight stored (OC, IC) as in torch.nn.Linear:
//   forward   out = inp @ W^T + b
//   backward  dinp = dout @ W,   dW += dout^T @ inp,   db += colsum(dout)
// All three products are one GEMM each (kernels/cpu/gemm.h); no transposed copies are made.
//
// GELU can be fused at either end, as cuBLASLt epilogues do on the GPU: the forward with pre_gelu
// writes the GEMM result (+ bias) to pre_gelu and gelu of it to out; the backward with pre_gelu
// multiplies dout @ W by gelu'(pre_gelu) before storing dinp. A residual is added to the forward's
// result before its one rounding, as the GEMM's C term (beta = 1) does on the GPU.
//
// Storage: for float/double the GEMMs run on the caller's buffers. For bf16/f16 the operands are
// loaded into fp32 scratch, the fp32 GEMM runs on it, bias and GELU are applied to the fp32 result,
// and each output is rounded once. Scratch is bounded by processing the rows of N in chunks
// (chunk_rows); dW and db then accumulate chunk by chunk, a fixed order for a given shape.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {
constexpr int kColBlock = 64;
// Rows of N per chunk of the 16-bit paths: at most ~4M fp32 scratch values per operand (16 MiB),
// in multiples of 256 rows and never fewer, so that each chunk still splits over the threads.
constexpr int64_t kChunkValues = int64_t(1) << 22;
constexpr int kChunkAlign = 256;

int chunk_rows(int N, int IC, int OC) {
  const int64_t widest = std::max<int64_t>(1, std::max(IC, OC));
  const int64_t rows = std::max<int64_t>(kChunkAlign, kChunkValues / widest / kChunkAlign * kChunkAlign);
  return int(std::min<int64_t>(N, rows));
}

// Loads a whole tensor into an fp32 vector, in parallel.
template <class S>
std::vector<float> load_all(const S* x, int64_t n) {
  std::vector<float> v(size_t(std::max<int64_t>(n, 0)));
  convert<float, S>(v.data(), x, n);
  return v;
}

// dbias[c] += sum over rows of dout[:, c]. Column blocks, rows summed in order: the same result for
// any thread count.
template <class A>
void bias_grad(A* dbias, const A* dout, int N, int OC) {
  const int blocks = (OC + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (parallel_worth(int64_t(N) * OC))
  for (int cb = 0; cb < blocks; cb++) {
    const int c0 = cb * kColBlock, c1 = std::min(OC, c0 + kColBlock);
    A acc[kColBlock] = {};
    for (int i = 0; i < N; i++) {
      const A* d = dout + int64_t(i) * OC;
      for (int c = c0; c < c1; c++) acc[c - c0] += d[c];
    }
    for (int c = c0; c < c1; c++) dbias[c] += acc[c - c0];
  }
}

// out[i] += residual[i] over n values, in parallel.
template <class A>
void add_residual(A* out, const A* residual, int64_t n) {
#pragma omp parallel for schedule(static) if (parallel_worth(n))
  for (int64_t i = 0; i < n; i++) out[i] += residual[i];
}

// out (N,OC) = inp @ weight^T + bias in the accumulation type, on A buffers.
template <class A>
void linear(A* out, const A* inp, const A* weight, const A* bias, int N, int IC, int OC) {
  if (bias) {
    // Seed out with the bias and let the GEMM accumulate onto it (beta = 1): one pass over out
    // instead of a second one after the product.
#pragma omp parallel for schedule(static) if (parallel_worth(int64_t(N) * OC))
    for (int i = 0; i < N; i++) std::copy(bias, bias + OC, out + int64_t(i) * OC);
  }
  gemm<A>(false, true, N, OC, IC, A(1), inp, IC, weight, IC, bias ? A(1) : A(0), out, OC);
}

}  // namespace

template <class S>
void matmul_fwd(S* out, const S* inp, const S* weight, const S* bias, int N, int IC, int OC, S* pre_gelu,
                const S* residual) {
  if constexpr (kWide<S>) {
    // Rounding is the identity here, so the fused epilogues are literally the unfused sequences:
    // pre_gelu = the GEMM result, out = gelu_fwd(pre_gelu); out = (product + bias) + residual, bitwise.
    linear<S>(pre_gelu ? pre_gelu : out, inp, weight, bias, N, IC, OC);
    if (pre_gelu) gelu_fwd<S>(out, pre_gelu, int64_t(N) * OC);
    if (residual) add_residual<S>(out, residual, int64_t(N) * OC);
  } else {
    const std::vector<float> w = load_all(weight, int64_t(OC) * IC);
    const std::vector<float> b = bias ? load_all(bias, OC) : std::vector<float>();
    const int rows = chunk_rows(N, IC, OC);
    std::vector<float> x(size_t(rows) * IC), acc(size_t(rows) * OC), res(residual ? acc.size() : 0);
    for (int i0 = 0; i0 < N; i0 += rows) {
      const int n = std::min(rows, N - i0);
      const int64_t in_off = int64_t(i0) * IC, out_off = int64_t(i0) * OC, n_out = int64_t(n) * OC;
      convert<float, S>(x.data(), inp + in_off, int64_t(n) * IC);
      linear<float>(acc.data(), x.data(), w.data(), bias ? b.data() : nullptr, n, IC, OC);
      if (pre_gelu) {
        // GELU from the unrounded sum, as a GELU_AUX epilogue computes it; pre_gelu keeps the
        // rounded sum for the backward.
        convert<S, float>(pre_gelu + out_off, acc.data(), n_out);
        gelu_fwd<float>(acc.data(), acc.data(), n_out);
      }
      if (residual) {  // added in fp32 before the one rounding, as the GEMM's C term
        convert<float, S>(res.data(), residual + out_off, n_out);
        add_residual<float>(acc.data(), res.data(), n_out);
      }
      convert<S, float>(out + out_off, acc.data(), n_out);
    }
  }
}

template <class S>
void matmul_bwd(S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp, const S* weight, int N,
                int IC, int OC, const S* pre_gelu, bool dweight_assign) {
  if (dweight && dweight_assign && N == 0) std::fill_n(dweight, int64_t(IC) * OC, acc_t<S>(0));  // an empty sum
  if constexpr (kWide<S>) {
    if (dinp) {
      gemm<S>(false, false, N, IC, OC, S(1), dout, OC, weight, IC, S(0), dinp, IC);
      // dinp * gelu'(pre_gelu) in place: bitwise the unfused gelu_bwd(dinp, dinp_unfused, pre_gelu).
      if (pre_gelu) gelu_bwd<S>(dinp, dinp, pre_gelu, int64_t(N) * IC);
    }
    if (dweight) gemm<S>(true, false, OC, IC, N, S(1), dout, OC, inp, IC, dweight_assign ? S(0) : S(1), dweight, IC);
    if (dbias) bias_grad(dbias, dout, N, OC);
  } else {
    const std::vector<float> w = dinp ? load_all(weight, int64_t(OC) * IC) : std::vector<float>();
    const int rows = chunk_rows(N, IC, OC);
    std::vector<float> d(size_t(rows) * OC), x(dweight ? size_t(rows) * IC : 0), acc(dinp ? size_t(rows) * IC : 0),
        pre(dinp && pre_gelu ? size_t(rows) * IC : 0);
    for (int i0 = 0; i0 < N; i0 += rows) {
      const int n = std::min(rows, N - i0);
      const int64_t in_off = int64_t(i0) * IC, n_in = int64_t(n) * IC;
      convert<float, S>(d.data(), dout + int64_t(i0) * OC, int64_t(n) * OC);
      if (dweight) convert<float, S>(x.data(), inp + in_off, n_in);
      if (dinp) {
        gemm<float>(false, false, n, IC, OC, 1.f, d.data(), OC, w.data(), IC, 0.f, acc.data(), IC);
        if (pre_gelu) {
          // The product stays in fp32 through the GELU backward: one rounding instead of two.
          convert<float, S>(pre.data(), pre_gelu + in_off, n_in);
          gelu_bwd<float>(acc.data(), acc.data(), pre.data(), n_in);
        }
      }
      if (dinp) convert<S, float>(dinp + in_off, acc.data(), n_in);
      // The first chunk writes over an assigned gradient; the others add to it.
      const float beta = dweight_assign && i0 == 0 ? 0.f : 1.f;
      if (dweight) gemm<float>(true, false, OC, IC, n, 1.f, d.data(), OC, x.data(), IC, beta, dweight, IC);
      if (dbias) bias_grad(dbias, d.data(), n, OC);
    }
  }
}

#define MT_MATMUL_INSTANTIATE(S)                                                                                 \
  template void matmul_fwd<S>(S*, const S*, const S*, const S*, int, int, int, S*, const S*);                    \
  template void matmul_bwd<S>(S*, acc_t<S>*, acc_t<S>*, const S*, const S*, const S*, int, int, int, const S*, bool);
MT_MATMUL_INSTANTIATE(float)
MT_MATMUL_INSTANTIATE(double)
MT_MATMUL_INSTANTIATE(bf16)
MT_MATMUL_INSTANTIATE(f16)
#undef MT_MATMUL_INSTANTIATE

}  // namespace mt::cpu
