// Causal (optionally document-masked) multi-head self-attention, the materialised path: the full T x T
// score matrix per head, batched GEMMs and a masked softmax. The flash path is flash_attention.cu.
//
// Per batch element b, the NH heads are one strided-batched GEMM (head h starts hs elements further
// into each row of qkv, and T*T further into att). In cuBLAS's column-major view a row-major (T, hs)
// slice with row stride 3C is a (hs x T) matrix with ld 3C, and att's row-major (T, T) block is P^T:
//   forward:  S^T = K^T Q / sqrt(hs)       fp32 scores (in att itself when S is float, else a temporary)
//             P   = masked softmax (fp32)  stored in att, rounded to S
//             O   = V P                    out (B,T,C), ld C, from the stored P (GEMM in S)
//   backward: dP^T = V^T dO                fp32, into scratch
//             dS   = P * (dP - rowsum(P * dP))   in place, fp32 (softmax backward)
//             dV   = dO P^T                S operands, written to dqkv
//             dQ   = K dS / sqrt(hs),  dK = Q dS^T / sqrt(hs)
// dS stays fp32, and cuBLASLt multiplies only operands of one type, so for bf16/f16 the dQ and dK
// products run in fp32 on an fp32 copy of qkv into an fp32 temporary, then are rounded once into
// dqkv. Every output is assigned. The full T x T product is computed and the masked half overwritten
// with zeros.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {
namespace {

constexpr int kRowsPerBlock = kBlock / kWarp;

// One warp per row (b, h, i): token i sees j <= i in its own document. The masked entries become exact
// zeros, so the P V product and the backward need no mask of their own. No __restrict__: for float
// storage att and scores are the same buffer (each lane reads and writes only its own columns j).
template <class D>
__global__ void masked_softmax_kernel(D* att, const float* scores, const int32_t* doc, int B, int NH, int T) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= int64_t(B) * NH * T) return;
  const int i = int(row % T);
  const int b = int(row / (int64_t(NH) * T));
  const int32_t* d = doc ? doc + int64_t(b) * T : nullptr;
  const float* s = scores + row * T;
  D* p = att + row * T;
  auto visible = [&](int j) { return j <= i && (d == nullptr || d[j] == d[i]); };
  float mx = -INFINITY;
  for (int j = lane; j <= i; j += kWarp)
    if (visible(j)) mx = fmaxf(mx, s[j]);
  mx = warp_reduce(mx, MaxOp{});
  float sum = 0.f;
  for (int j = lane; j <= i; j += kWarp)
    if (visible(j)) sum += expf(s[j] - mx);
  const float inv = 1.f / warp_reduce(sum, SumOp{});
  for (int j = lane; j < T; j += kWarp) p[j] = store_as<D>(visible(j) ? expf(s[j] - mx) * inv : 0.f);
}

// dS = P * (dP - sum_j P dP) per row, in place over dP. P is zero wherever a token may not look, so the
// product is zero there too; the causal half is written explicitly.
template <class D>
__global__ void softmax_bwd_kernel(float* dp, const D* att, int64_t rows, int T) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= rows) return;
  const int i = int(row % T);
  const D* p = att + row * T;
  float* g = dp + row * T;
  float dot = 0.f;
  for (int j = lane; j <= i; j += kWarp) dot += load(p[j]) * g[j];
  dot = warp_reduce(dot, SumOp{});
  for (int j = lane; j < T; j += kWarp) g[j] = j <= i ? load(p[j]) * (g[j] - dot) : 0.f;
}

// dqkv[r, c] = dqk[r, c] rounded, for the q and k columns c < 2C of every row r (row stride 3C).
template <class D>
__global__ void store_qk_kernel(D* dqkv, const float* dqk, int64_t rows, int C) {
  const int64_t total = rows * 2 * C;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / (2 * C);
    const int64_t at = r * 3 * C + (idx - r * 2 * C);
    dqkv[at] = store_as<D>(dqk[at]);
  }
}

struct Dims {
  int B, T, C, NH, hs;
  int64_t tt() const { return int64_t(T) * T; }
  int64_t qkv_row(int b) const { return int64_t(b) * T * 3 * C; }
};

// A per-head GEMM batched over the NH heads of one batch element.
Gemm head_gemm(const Dims& s, int m, int n, int k, DType ab, DType d) {
  Gemm g;
  g.m = m, g.n = n, g.k = k;
  g.batch = s.NH;
  g.ab_type = ab, g.d_type = d;
  return g;
}

// An fp32 device temporary on the op's stream, freed on scope exit (also when a check throws).
class StreamTemp {
 public:
  StreamTemp(size_t floats, cudaStream_t stream) : stream_(stream) {
    if (floats) MT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), floats * sizeof(float), stream));
  }
  StreamTemp(const StreamTemp&) = delete;
  StreamTemp& operator=(const StreamTemp&) = delete;
  ~StreamTemp() {
    if (p_) (void)cudaFreeAsync(p_, stream_);
  }
  float* get() const { return p_; }

 private:
  float* p_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace

template <class S>
void attention_fwd(S* out, S* att, const S* qkv, const int32_t* doc, int B, int T, int C, int NH,
                   const ops::Ctx& ctx) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention_fwd: C=%d is not divisible by NH=%d", C, NH);
  if (B == 0 || T == 0) return;
  constexpr bool kF32 = std::is_same_v<S, float>;
  const Dims s{B, T, C, NH, C / NH};
  const DType st = dtype_of<S>();
  const float scale = 1.f / std::sqrt(float(s.hs));
  cudaStream_t stream = stream_of(ctx);
  StreamTemp temp(kF32 ? 0 : size_t(B) * NH * s.tt(), stream);
  float* scores = kF32 ? reinterpret_cast<float*>(att) : temp.get();
  for (int b = 0; b < B; b++) {
    const S* q = qkv + s.qkv_row(b);
    Gemm g = head_gemm(s, T, T, s.hs, st, DType::f32);  // S^T (T x T) = K^T Q
    g.trans_a = true, g.a = q + C, g.lda = 3 * C, g.stride_a = s.hs;
    g.b = q, g.ldb = 3 * C, g.stride_b = s.hs;
    g.d = scores + int64_t(b) * NH * s.tt(), g.ldd = T, g.stride_d = s.tt();
    g.alpha = scale;
    gemm(g, ctx);
  }
  const int64_t rows = int64_t(B) * NH * T;
  masked_softmax_kernel<<<ceil_div(rows, kRowsPerBlock), kBlock, 0, stream>>>(dev_ptr(att), scores, doc, B, NH, T);
  MT_CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; b++) {
    Gemm g = head_gemm(s, s.hs, T, T, st, st);  // O (hs x T) = V (hs x T) P^T-as-stored (T x T)
    g.a = qkv + s.qkv_row(b) + 2 * C, g.lda = 3 * C, g.stride_a = s.hs;
    g.b = att + int64_t(b) * NH * s.tt(), g.ldb = T, g.stride_b = s.tt();
    g.d = out + int64_t(b) * T * C, g.ldd = C, g.stride_d = s.hs;
    gemm(g, ctx);
  }
}

template <class S>
void attention_bwd(S* dqkv, float* scratch, const S* dout, const S* qkv, const S* att, const int32_t* doc, int B,
                   int T, int C, int NH, const ops::Ctx& ctx) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention_bwd: C=%d is not divisible by NH=%d", C, NH);
  (void)doc;  // the mask is already in att: P == 0 wherever a token may not attend
  if (B == 0 || T == 0) return;
  constexpr bool kF32 = std::is_same_v<S, float>;
  const Dims s{B, T, C, NH, C / NH};
  const DType st = dtype_of<S>();
  const float scale = 1.f / std::sqrt(float(s.hs));
  cudaStream_t stream = stream_of(ctx);
  const int64_t nqkv = int64_t(B) * T * 3 * C;

  // fp32 views of qkv (read) and of dQ, dK (written): the tensors themselves for float storage.
  StreamTemp qkv_temp(kF32 ? 0 : size_t(nqkv), stream), dqk_temp(kF32 ? 0 : size_t(nqkv), stream);
  const float* qkv32 = kF32 ? reinterpret_cast<const float*>(qkv) : qkv_temp.get();
  float* dqk32 = kF32 ? reinterpret_cast<float*>(dqkv) : dqk_temp.get();
  if constexpr (!kF32) cuda::convert<float, S>(qkv_temp.get(), qkv, nqkv, ctx);

  for (int b = 0; b < B; b++) {
    Gemm g = head_gemm(s, T, T, s.hs, st, DType::f32);  // dP^T (T x T) = V^T dO
    g.trans_a = true, g.a = qkv + s.qkv_row(b) + 2 * C, g.lda = 3 * C, g.stride_a = s.hs;
    g.b = dout + int64_t(b) * T * C, g.ldb = C, g.stride_b = s.hs;
    g.d = scratch + int64_t(b) * NH * s.tt(), g.ldd = T, g.stride_d = s.tt();
    gemm(g, ctx);
  }
  const int64_t rows = int64_t(B) * NH * T;
  softmax_bwd_kernel<<<ceil_div(rows, kRowsPerBlock), kBlock, 0, stream>>>(scratch, dev_ptr(att), rows, T);
  MT_CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; b++) {
    const int64_t row0 = s.qkv_row(b);
    const float* ds = scratch + int64_t(b) * NH * s.tt();

    Gemm gq = head_gemm(s, s.hs, T, T, DType::f32, DType::f32);  // dQ (hs x T) = K dS^T-as-stored
    gq.a = qkv32 + row0 + C, gq.lda = 3 * C, gq.stride_a = s.hs;
    gq.b = ds, gq.ldb = T, gq.stride_b = s.tt();
    gq.d = dqk32 + row0, gq.ldd = 3 * C, gq.stride_d = s.hs;
    gq.alpha = scale;
    gemm(gq, ctx);

    Gemm gk = head_gemm(s, s.hs, T, T, DType::f32, DType::f32);  // dK (hs x T) = Q (dS^T-as-stored)^T
    gk.a = qkv32 + row0, gk.lda = 3 * C, gk.stride_a = s.hs;
    gk.trans_b = true, gk.b = ds, gk.ldb = T, gk.stride_b = s.tt();
    gk.d = dqk32 + row0 + C, gk.ldd = 3 * C, gk.stride_d = s.hs;
    gk.alpha = scale;
    gemm(gk, ctx);

    Gemm gv = head_gemm(s, s.hs, T, T, st, st);  // dV (hs x T) = dO (P^T-as-stored)^T
    gv.a = dout + int64_t(b) * T * C, gv.lda = C, gv.stride_a = s.hs;
    gv.trans_b = true, gv.b = att + int64_t(b) * NH * s.tt(), gv.ldb = T, gv.stride_b = s.tt();
    gv.d = dqkv + row0 + 2 * C, gv.ldd = 3 * C, gv.stride_d = s.hs;
    gemm(gv, ctx);
  }
  if constexpr (!kF32) {
    store_qk_kernel<<<grid_for(int64_t(B) * T * 2 * C), kBlock, 0, stream>>>(dev_ptr(dqkv), dqk_temp.get(),
                                                                            int64_t(B) * T, C);
    MT_CUDA_CHECK_LAUNCH();
  }
}

#define MT_ATTENTION_INSTANTIATE(S)                                                                           \
  template void attention_fwd<S>(S*, S*, const S*, const int32_t*, int, int, int, int, const ops::Ctx&);       \
  template void attention_bwd<S>(S*, float*, const S*, const S*, const S*, const int32_t*, int, int, int, int, \
                                 const ops::Ctx&);
MT_ATTENTION_INSTANTIATE(float)
MT_ATTENTION_INSTANTIATE(bf16)
MT_ATTENTION_INSTANTIATE(f16)
#undef MT_ATTENTION_INSTANTIATE

}  // namespace mt::cuda
