// Flash attention (Dao et al. 2022), FlashAttention-2's loop order (Dao 2023): causal, optionally
// document-masked multi-head attention without a T x T buffer, on storage type S with fp32 math.
//
// These kernels are plain fp32 SIMT arithmetic on tiles staged in shared memory (converted from S on
// load), for head sizes up to kMaxHeadSize (128). They run for fp32 storage and wherever the
// tensor-core kernels (flash_attention_mma.cu: bf16/fp16, head size 32/64/128) do not take the call.
//
// Forward, one thread block per (64-query block, head, batch row). With s_ij = q_i . k_j / sqrt(hs)
// (-inf where masked), the block walks the key blocks 0 .. its diagonal (blocks wholly above the
// diagonal are skipped) keeping per query the running max m_i, sum l_i and unnormalised output o_i:
//   m' = max(m, max_j s_ij),  l = l e^(m - m') + sum_j e^(s_ij - m'),  o = o e^(m - m') + sum_j e^(s_ij - m') v_j
// and writes out_i = o_i / l_i (rounded to S) and lse_i = m_i + log l_i (fp32).
//
// Backward, deterministically and without atomics: P is recomputed from lse, P_ij = e^(s_ij - lse_i),
// and with D_i = rowsum(dO_i * O_i) (a small kernel, into scratch):
//   dP_ij = dO_i . v_j,   dS_ij = P_ij (dP_ij - D_i)
//   dV_j = sum_i P_ij dO_i,   dK_j = sum_i dS_ij q_i / sqrt(hs),   dQ_i = sum_j dS_ij k_j / sqrt(hs)
// One kernel per (key block, head, batch row) loops over the query blocks from its diagonal on and
// owns dK, dV of its keys; another per (query block, head, batch row) loops over the key blocks up to
// its diagonal and owns dQ. Every output element is summed by one thread in a fixed order and written
// once, rounded to S.
//
// Thread layout of every tile kernel: 8 warps; warp w owns 8 rows (queries, or keys for dK/dV) of the
// block, lane l the columns l and l + 32 of the 64-wide score tile, and the head dimensions l + 32e
// (e < ND = ceil(hs/32)) of the row accumulators. Tiles whose rows are read across lanes are padded to
// hs + 1 floats per row (conflict-free shared memory banks for even hs).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/flash_attention_mma.cuh"
#include "kernels/cuda/shared_memory.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {
namespace {

using namespace flash_attention_kernels;

struct FlashShape {
  int B, T, C, NH, hs;
  float scale() const { return 1.f / std::sqrt(float(hs)); }
};

FlashShape check_shape(int B, int T, int C, int NH, const char* op) {
  MT_CHECK(NH > 0 && C > 0 && C % NH == 0, "%s: C=%d is not divisible by NH=%d", op, C, NH);
  const int hs = C / NH;
  MT_CHECK(hs <= kMaxHeadSize,
           "%s: head size C/NH = %d/%d = %d is above the flash kernels' limit of %d; use the materialised attention",
           op, C, NH, hs, kMaxHeadSize);
  MT_CHECK(B >= 0 && B <= 65535 && NH <= 65535 && T >= 0, "%s: bad sizes B=%d T=%d NH=%d", op, B, T, NH);
  return FlashShape{B, T, C, NH, hs};
}

template <class D, int ND>
void launch_fwd(D* out, float* lse, const D* qkv, const int32_t* doc, const FlashShape& s, cudaStream_t stream) {
  const LaunchShape l = fwd_shape(s.B, s.T, s.NH, s.hs);
  opt_in_shared_memory(flash_fwd_kernel<D, ND>, l.smem, "flash_attention_fwd");
  MT_LAUNCH(l, stream, flash_fwd_kernel<D, ND>)(out, lse, qkv, doc, s.T, s.C, s.NH, s.scale());
  MT_CUDA_CHECK_LAUNCH();
}

template <class D, int ND>
void launch_bwd(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* dsum, const int32_t* doc,
                const FlashShape& s, cudaStream_t stream) {
  const LaunchShape lkv = dkdv_shape(s.B, s.T, s.NH, s.hs), lq = dq_shape(s.B, s.T, s.NH, s.hs);
  opt_in_shared_memory(flash_bwd_dkdv_kernel<D, ND>, lkv.smem, "flash_attention_bwd");
  MT_LAUNCH(lkv, stream, flash_bwd_dkdv_kernel<D, ND>)(dqkv, dout, qkv, lse, dsum, doc, s.T, s.C, s.NH, s.scale());
  MT_CUDA_CHECK_LAUNCH();
  opt_in_shared_memory(flash_bwd_dq_kernel<D, ND>, lq.smem, "flash_attention_bwd");
  MT_LAUNCH(lq, stream, flash_bwd_dq_kernel<D, ND>)(dqkv, dout, qkv, lse, dsum, doc, s.T, s.C, s.NH, s.scale());
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <class S>
void flash_attention_fwd(S* out, float* lse, const S* qkv, const int32_t* doc, int B, int T, int C, int NH,
                         const ops::Ctx& ctx) {
  const FlashShape s = check_shape(B, T, C, NH, "flash_attention_fwd");
  if (B == 0 || T == 0) return;
  auto* o = dev_ptr(out);
  const auto* x = dev_ptr(qkv);
  cudaStream_t stream = stream_of(ctx);
  if constexpr (!std::is_same_v<S, float>) {
    if (flash_mma::takes_fwd(s.hs, o, x)) return flash_mma::fwd(o, lse, x, doc, B, T, C, NH, stream);
  }
  switch (head_chunks(s.hs)) {
    case 1: launch_fwd<dev_t<S>, 1>(o, lse, x, doc, s, stream); break;
    case 2: launch_fwd<dev_t<S>, 2>(o, lse, x, doc, s, stream); break;
    case 3: launch_fwd<dev_t<S>, 3>(o, lse, x, doc, s, stream); break;
    default: launch_fwd<dev_t<S>, 4>(o, lse, x, doc, s, stream); break;
  }
}

template <class S>
void flash_attention_bwd(S* dqkv, float* scratch, const S* dout, const S* qkv, const S* out, const float* lse,
                         const int32_t* doc, int B, int T, int C, int NH, const ops::Ctx& ctx) {
  const FlashShape s = check_shape(B, T, C, NH, "flash_attention_bwd");
  if (B == 0 || T == 0) return;
  cudaStream_t stream = stream_of(ctx);
  const int64_t rows = int64_t(B) * NH * T;
  const LaunchShape ld = dsum_shape(rows);
  MT_LAUNCH(ld, stream, flash_dsum_kernel<dev_t<S>>)(scratch, dev_ptr(dout), dev_ptr(out), B, T, C, NH);
  MT_CUDA_CHECK_LAUNCH();
  auto* g = dev_ptr(dqkv);
  const auto* dy = dev_ptr(dout);
  const auto* x = dev_ptr(qkv);
  if constexpr (!std::is_same_v<S, float>) {
    if (flash_mma::takes_bwd(s.hs, g, dy, x)) return flash_mma::bwd(g, dy, x, lse, scratch, doc, B, T, C, NH, stream);
  }
  switch (head_chunks(s.hs)) {
    case 1: launch_bwd<dev_t<S>, 1>(g, dy, x, lse, scratch, doc, s, stream); break;
    case 2: launch_bwd<dev_t<S>, 2>(g, dy, x, lse, scratch, doc, s, stream); break;
    case 3: launch_bwd<dev_t<S>, 3>(g, dy, x, lse, scratch, doc, s, stream); break;
    default: launch_bwd<dev_t<S>, 4>(g, dy, x, lse, scratch, doc, s, stream); break;
  }
}

bool flash_attention_on_tensor_cores(DType t, int hs, bool backward) {
  if (t != DType::bf16 && t != DType::f16) return false;
  return backward ? flash_mma::takes_bwd(hs, nullptr, nullptr, nullptr) : flash_mma::takes_fwd(hs, nullptr, nullptr);
}

#define MT_FLASH_INSTANTIATE(S)                                                                                  \
  template void flash_attention_fwd<S>(S*, float*, const S*, const int32_t*, int, int, int, int, const ops::Ctx&); \
  template void flash_attention_bwd<S>(S*, float*, const S*, const S*, const S*, const float*, const int32_t*, int, \
                                       int, int, int, const ops::Ctx&);
MT_FLASH_INSTANTIATE(float)
MT_FLASH_INSTANTIATE(bf16)
MT_FLASH_INSTANTIATE(f16)
#undef MT_FLASH_INSTANTIATE

}  // namespace mt::cuda
