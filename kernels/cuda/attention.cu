// Causal (optionally document-masked) multi-head self-attention, first pass: correctness over speed.
//
// Per batch element b, the NH heads are one strided-batched GEMM (head h starts hs floats further into
// each row of qkv, and T*T further into att). In cuBLAS's column-major view a row-major (T, hs) slice
// with row stride 3C is a (hs x T) matrix with ld 3C, and att's row-major (T, T) block is P^T:
//   forward:  S^T = K^T Q / sqrt(hs)       into att, then the masked softmax in place (rows of att)
//             O   = V P                    out (B,T,C), ld C
//   backward: dP^T = V^T dO                into scratch
//             dS   = P * (dP - rowsum(P * dP))   in place (softmax backward)
//             dQ   = K dS / sqrt(hs),  dK = Q dS^T / sqrt(hs),  dV = dO P^T    (all assigned)
// The full T x T product is computed and the masked half overwritten with zeros; a fused (flash)
// kernel is the later fast path.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.cuh"

namespace mt::cuda {
namespace {

constexpr int kRowsPerBlock = kBlock / kWarp;

// One warp per row (b, h, i) of att: token i sees j <= i in its own document. The masked entries become
// exact zeros, so the P V product and the backward need no mask of their own.
__global__ void masked_softmax_kernel(float* att, const int32_t* doc, int B, int NH, int T) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= int64_t(B) * NH * T) return;
  const int i = int(row % T);
  const int b = int(row / (int64_t(NH) * T));
  const int32_t* d = doc ? doc + int64_t(b) * T : nullptr;
  float* p = att + row * T;
  auto visible = [&](int j) { return j <= i && (d == nullptr || d[j] == d[i]); };
  float mx = -INFINITY;
  for (int j = lane; j <= i; j += kWarp)
    if (visible(j)) mx = fmaxf(mx, p[j]);
  mx = warp_reduce(mx, MaxOp{});
  float sum = 0.f;
  for (int j = lane; j <= i; j += kWarp) {
    const float e = visible(j) ? expf(p[j] - mx) : 0.f;
    p[j] = e;
    sum += e;
  }
  const float inv = 1.f / warp_reduce(sum, SumOp{});
  for (int j = lane; j < T; j += kWarp) p[j] = j <= i ? p[j] * inv : 0.f;
}

// dS = P * (dP - sum_j P dP) per row, in place over dP. P is zero wherever a token may not look, so the
// product is zero there too; the causal half is written explicitly.
__global__ void softmax_bwd_kernel(float* dp, const float* att, int64_t rows, int T) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= rows) return;
  const int i = int(row % T);
  const float* p = att + row * T;
  float* g = dp + row * T;
  float dot = 0.f;
  for (int j = lane; j <= i; j += kWarp) dot += p[j] * g[j];
  dot = warp_reduce(dot, SumOp{});
  for (int j = lane; j < T; j += kWarp) g[j] = j <= i ? p[j] * (g[j] - dot) : 0.f;
}

struct Dims {
  int B, T, C, NH, hs;
  int64_t tt() const { return int64_t(T) * T; }
};

// A per-head GEMM batched over the NH heads of one batch element.
Gemm head_gemm(const Dims& s, int m, int n, int k) {
  Gemm g;
  g.m = m, g.n = n, g.k = k;
  g.batch = s.NH;
  return g;
}

}  // namespace

void attention_fwd(float* out, float* att, const float* qkv, const int32_t* doc, int B, int T, int C, int NH,
                   const ops::Ctx& ctx) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention_fwd: C=%d is not divisible by NH=%d", C, NH);
  if (B == 0 || T == 0) return;
  const Dims s{B, T, C, NH, C / NH};
  const float scale = 1.f / std::sqrt(float(s.hs));
  for (int b = 0; b < B; b++) {
    const float* q = qkv + int64_t(b) * T * 3 * C;
    const float* k = q + C;
    float* a = att + int64_t(b) * NH * s.tt();
    Gemm scores = head_gemm(s, T, T, s.hs);  // S^T (T x T) = K^T Q
    scores.trans_a = true, scores.a = k, scores.lda = 3 * C, scores.stride_a = s.hs;
    scores.b = q, scores.ldb = 3 * C, scores.stride_b = s.hs;
    scores.d = a, scores.ldd = T, scores.stride_d = s.tt();
    scores.alpha = scale;
    gemm(scores, ctx);
  }
  const int64_t rows = int64_t(B) * NH * T;
  masked_softmax_kernel<<<ceil_div(rows, kRowsPerBlock), kBlock, 0, stream_of(ctx)>>>(att, doc, B, NH, T);
  MT_CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; b++) {
    const float* v = qkv + int64_t(b) * T * 3 * C + 2 * C;
    Gemm pv = head_gemm(s, s.hs, T, T);  // O (hs x T) = V (hs x T) P^T-as-stored (T x T)
    pv.a = v, pv.lda = 3 * C, pv.stride_a = s.hs;
    pv.b = att + int64_t(b) * NH * s.tt(), pv.ldb = T, pv.stride_b = s.tt();
    pv.d = out + int64_t(b) * T * C, pv.ldd = C, pv.stride_d = s.hs;
    gemm(pv, ctx);
  }
}

void attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                   const int32_t* doc, int B, int T, int C, int NH, const ops::Ctx& ctx) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention_bwd: C=%d is not divisible by NH=%d", C, NH);
  (void)doc;  // the mask is already in att: P == 0 wherever a token may not attend
  if (B == 0 || T == 0) return;
  const Dims s{B, T, C, NH, C / NH};
  const float scale = 1.f / std::sqrt(float(s.hs));
  for (int b = 0; b < B; b++) {
    const float* v = qkv + int64_t(b) * T * 3 * C + 2 * C;
    Gemm dp = head_gemm(s, T, T, s.hs);  // dP^T (T x T) = V^T dO
    dp.trans_a = true, dp.a = v, dp.lda = 3 * C, dp.stride_a = s.hs;
    dp.b = dout + int64_t(b) * T * C, dp.ldb = C, dp.stride_b = s.hs;
    dp.d = scratch + int64_t(b) * NH * s.tt(), dp.ldd = T, dp.stride_d = s.tt();
    gemm(dp, ctx);
  }
  const int64_t rows = int64_t(B) * NH * T;
  softmax_bwd_kernel<<<ceil_div(rows, kRowsPerBlock), kBlock, 0, stream_of(ctx)>>>(scratch, att, rows, T);
  MT_CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; b++) {
    const int64_t row0 = int64_t(b) * T * 3 * C;
    const float* q = qkv + row0;
    const float* k = q + C;
    float* dq = dqkv + row0;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* ds = scratch + int64_t(b) * NH * s.tt();
    const float* p = att + int64_t(b) * NH * s.tt();
    const float* dy = dout + int64_t(b) * T * C;

    Gemm gq = head_gemm(s, s.hs, T, T);  // dQ (hs x T) = K (hs x T) dS^T-as-stored (T x T)
    gq.a = k, gq.lda = 3 * C, gq.stride_a = s.hs;
    gq.b = ds, gq.ldb = T, gq.stride_b = s.tt();
    gq.d = dq, gq.ldd = 3 * C, gq.stride_d = s.hs;
    gq.alpha = scale;
    gemm(gq, ctx);

    Gemm gk = head_gemm(s, s.hs, T, T);  // dK (hs x T) = Q (hs x T) (dS^T-as-stored)^T
    gk.a = q, gk.lda = 3 * C, gk.stride_a = s.hs;
    gk.trans_b = true, gk.b = ds, gk.ldb = T, gk.stride_b = s.tt();
    gk.d = dk, gk.ldd = 3 * C, gk.stride_d = s.hs;
    gk.alpha = scale;
    gemm(gk, ctx);

    Gemm gv = head_gemm(s, s.hs, T, T);  // dV (hs x T) = dO (hs x T) (P^T-as-stored)^T
    gv.a = dy, gv.lda = C, gv.stride_a = s.hs;
    gv.trans_b = true, gv.b = p, gv.ldb = T, gv.stride_b = s.tt();
    gv.d = dv, gv.ldd = 3 * C, gv.stride_d = s.hs;
    gemm(gv, ctx);
  }
}

}  // namespace mt::cuda
