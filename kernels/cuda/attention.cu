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

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/cuda/stream_temp.cuh"

namespace mt::cuda {
namespace {

using namespace attention_kernels;

}  // namespace

template <class S>
void attention_fwd(S* out, S* att, const S* qkv, const int32_t* doc, int B, int T, int C, int NH,
                   const ops::Ctx& ctx) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention_fwd: C=%d is not divisible by NH=%d", C, NH);
  if (B == 0 || T == 0) return;
  constexpr bool kF32 = std::is_same_v<S, float>;
  const Dims s{B, T, C, NH, C / NH};
  cudaStream_t stream = stream_of(ctx);
  StreamTemp<float> temp(kF32 ? 0 : size_t(B) * NH * s.tt(), stream);
  float* scores = kF32 ? reinterpret_cast<float*>(att) : temp.get();
  for (int b = 0; b < B; b++) gemm(scores_gemm(s, scores, qkv, b), ctx);
  const int64_t rows = int64_t(B) * NH * T;
  const LaunchShape l = rows_shape(rows);
  MT_LAUNCH(l, stream, masked_softmax_kernel<dev_t<S>>)(dev_ptr(att), scores, doc, B, NH, T);
  MT_CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; b++) gemm(out_gemm(s, out, qkv, att, b), ctx);
}

template <class S>
void attention_bwd(S* dqkv, float* scratch, const S* dout, const S* qkv, const S* att, const int32_t* doc, int B,
                   int T, int C, int NH, const ops::Ctx& ctx) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention_bwd: C=%d is not divisible by NH=%d", C, NH);
  (void)doc;  // the mask is already in att: P == 0 wherever a token may not attend
  if (B == 0 || T == 0) return;
  constexpr bool kF32 = std::is_same_v<S, float>;
  const Dims s{B, T, C, NH, C / NH};
  cudaStream_t stream = stream_of(ctx);
  const int64_t nqkv = int64_t(B) * T * 3 * C;

  // fp32 views of qkv (read) and of dQ, dK (written): the tensors themselves for float storage.
  StreamTemp<float> qkv_temp(kF32 ? 0 : size_t(nqkv), stream), dqk_temp(kF32 ? 0 : size_t(nqkv), stream);
  const float* qkv32 = kF32 ? reinterpret_cast<const float*>(qkv) : qkv_temp.get();
  float* dqk32 = kF32 ? reinterpret_cast<float*>(dqkv) : dqk_temp.get();
  if constexpr (!kF32) cuda::convert<float, S>(qkv_temp.get(), qkv, nqkv, ctx);

  for (int b = 0; b < B; b++) gemm(dp_gemm(s, scratch, dout, qkv, b), ctx);
  const int64_t rows = int64_t(B) * NH * T;
  const LaunchShape l = rows_shape(rows);
  MT_LAUNCH(l, stream, softmax_bwd_kernel<dev_t<S>>)(scratch, dev_ptr(att), rows, T);
  MT_CUDA_CHECK_LAUNCH();
  for (int b = 0; b < B; b++) {
    gemm(dq_gemm(s, dqk32, qkv32, scratch, b), ctx);
    gemm(dk_gemm(s, dqk32, qkv32, scratch, b), ctx);
    gemm(dv_gemm(s, dqkv, dout, att, b), ctx);
  }
  if constexpr (!kF32) {
    const LaunchShape lq = store_qk_shape(int64_t(B) * T, C);
    MT_LAUNCH(lq, stream, store_qk_kernel<dev_t<S>>)(dev_ptr(dqkv), dqk_temp.get(), int64_t(B) * T, C);
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
