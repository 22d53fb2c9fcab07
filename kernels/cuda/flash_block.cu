// Block attention for ring attention on the GPU (the launchers of flash_block_kernels.cuh): a query
// block against a key/value block with global positions and document ids, the fp32 merge of two
// partial results by their log-sum-exp, the delta rowsum(dO * O), the accumulating backward, and the
// column-slice copy that takes a block out of qkv.
// Positions and document ids are device arrays here (the host decides which block pairs to skip
// with ops::attention_block_hidden on its own copies).
#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/flash_block_kernels.cuh"
#include "kernels/cuda/shared_memory.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {
namespace {

using namespace flash_block_kernels;
using flash_attention_kernels::head_chunks;
using flash_attention_kernels::kMaxHeadSize;

int check_block_shape(int B, int Tq, int Tk, int C, int NH, const char* op) {
  MT_CHECK(NH > 0 && C > 0 && C % NH == 0, "%s: C=%d is not divisible by NH=%d", op, C, NH);
  const int hs = C / NH;
  MT_CHECK(hs <= kMaxHeadSize, "%s: head size %d is above the block kernels' limit of %d", op, hs, kMaxHeadSize);
  MT_CHECK(B >= 0 && B <= 65535 && NH <= 65535 && Tq >= 0 && Tk >= 0, "%s: bad sizes B=%d Tq=%d Tk=%d NH=%d", op, B,
           Tq, Tk, NH);
  return hs;
}

template <class D, int ND>
void launch_fwd(float* out, float* lse, const D* q, int ldq, const D* k, const D* v, int ldkv, const int32_t* q_pos,
                const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B, int Tq, int Tk, int C, int NH,
                cudaStream_t stream) {
  const int hs = C / NH;
  const LaunchShape l = tile_shape(B, Tq, NH, fwd_smem_bytes(hs));
  opt_in_shared_memory(block_fwd_kernel<D, ND>, l.smem, "flash_block_fwd");
  MT_LAUNCH(l, stream, block_fwd_kernel<D, ND>)(
      out, lse, q, ldq, k, v, ldkv, q_pos, k_pos, q_doc, k_doc, Tq, Tk, C, NH, 1.f / std::sqrt(float(hs)));
  MT_CUDA_CHECK_LAUNCH();
}

template <class D, int ND>
void launch_bwd(float* dq, float* dk, float* dv, int lddkv, const D* dout, const D* q, int ldq, const D* k,
                const D* v, int ldkv, const float* lse, const float* delta, const int32_t* q_pos, const int32_t* k_pos,
                const int32_t* q_doc, const int32_t* k_doc, int B, int Tq, int Tk, int C, int NH, cudaStream_t stream) {
  const int hs = C / NH;
  const float scale = 1.f / std::sqrt(float(hs));
  const LaunchShape lkv = tile_shape(B, Tk, NH, dkdv_smem_bytes(hs)), lq = tile_shape(B, Tq, NH, dq_smem_bytes(hs));
  opt_in_shared_memory(block_bwd_dkdv_kernel<D, ND>, lkv.smem, "flash_block_bwd");
  MT_LAUNCH(lkv, stream, block_bwd_dkdv_kernel<D, ND>)(
      dk, dv, lddkv, dout, q, ldq, k, v, ldkv, lse, delta, q_pos, k_pos, q_doc, k_doc, Tq, Tk, C, NH, scale);
  MT_CUDA_CHECK_LAUNCH();
  opt_in_shared_memory(block_bwd_dq_kernel<D, ND>, lq.smem, "flash_block_bwd");
  MT_LAUNCH(lq, stream, block_bwd_dq_kernel<D, ND>)(
      dq, dout, q, ldq, k, v, ldkv, lse, delta, q_pos, k_pos, q_doc, k_doc, Tq, Tk, C, NH, scale);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <class S>
void flash_block_fwd(float* out, float* lse, const S* q, int ldq, const S* k, const S* v, int ldkv,
                     const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B,
                     int Tq, int Tk, int C, int NH, const ops::Ctx& ctx) {
  const int hs = check_block_shape(B, Tq, Tk, C, NH, "flash_block_fwd");
  if (B == 0 || Tq == 0) return;
  const auto *x = dev_ptr(q), *kk = dev_ptr(k), *vv = dev_ptr(v);
  using D = dev_t<S>;
  cudaStream_t st = stream_of(ctx);
  switch (head_chunks(hs)) {
    case 1: return launch_fwd<D, 1>(out, lse, x, ldq, kk, vv, ldkv, q_pos, k_pos, q_doc, k_doc, B, Tq, Tk, C, NH, st);
    case 2: return launch_fwd<D, 2>(out, lse, x, ldq, kk, vv, ldkv, q_pos, k_pos, q_doc, k_doc, B, Tq, Tk, C, NH, st);
    case 3: return launch_fwd<D, 3>(out, lse, x, ldq, kk, vv, ldkv, q_pos, k_pos, q_doc, k_doc, B, Tq, Tk, C, NH, st);
    default: return launch_fwd<D, 4>(out, lse, x, ldq, kk, vv, ldkv, q_pos, k_pos, q_doc, k_doc, B, Tq, Tk, C, NH, st);
  }
}

void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse, int B, int T, int C,
                     int NH, const ops::Ctx& ctx) {
  const int64_t rows = int64_t(B) * NH * T;
  if (rows == 0) return;
  const LaunchShape l = merge_shape(rows);
  MT_LAUNCH(l, stream_of(ctx), merge_kernel)(out, lse, part_out, part_lse, B, T, C, NH);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void attention_delta(float* delta, const S* dout, const S* out, int B, int T, int C, int NH, const ops::Ctx& ctx) {
  const int64_t rows = int64_t(B) * NH * T;
  if (rows == 0) return;
  const LaunchShape l = flash_attention_kernels::dsum_shape(rows);
  MT_LAUNCH(l, stream_of(ctx), flash_attention_kernels::flash_dsum_kernel<dev_t<S>>)(
      delta, dev_ptr(dout), dev_ptr(out), B, T, C, NH);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void flash_block_bwd(float* dq, float* dk, float* dv, int lddkv, const S* dout, const S* q, int ldq, const S* k,
                     const S* v, int ldkv, const float* lse, const float* delta, const int32_t* q_pos,
                     const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B, int Tq, int Tk, int C,
                     int NH, const ops::Ctx& ctx) {
  const int hs = check_block_shape(B, Tq, Tk, C, NH, "flash_block_bwd");
  if (B == 0 || Tq == 0 || Tk == 0) return;
  const auto *g = dev_ptr(dout), *x = dev_ptr(q), *kk = dev_ptr(k), *vv = dev_ptr(v);
  using D = dev_t<S>;
  cudaStream_t st = stream_of(ctx);
#define MT_BLOCK_BWD(ND)                                                                                           \
  return launch_bwd<D, ND>(dq, dk, dv, lddkv, g, x, ldq, kk, vv, ldkv, lse, delta, q_pos, k_pos, q_doc, k_doc, B, \
                           Tq, Tk, C, NH, st)
  switch (head_chunks(hs)) {
    case 1: MT_BLOCK_BWD(1);
    case 2: MT_BLOCK_BWD(2);
    case 3: MT_BLOCK_BWD(3);
    default: MT_BLOCK_BWD(4);
  }
#undef MT_BLOCK_BWD
}

template <class T>
void copy_columns(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t cols,
                  const ops::Ctx& ctx) {
  if (rows <= 0 || cols <= 0) return;
  const LaunchShape l = copy_columns_shape(rows * cols);
  MT_LAUNCH(l, stream_of(ctx), copy_columns_kernel<dev_t<T>>)(dev_ptr(dst), ld_dst, dev_ptr(src), ld_src, rows, cols);
  MT_CUDA_CHECK_LAUNCH();
}

#define MT_FLASH_BLOCK_INSTANTIATE(S)                                                                           \
  template void flash_block_fwd<S>(float*, float*, const S*, int, const S*, const S*, int, const int32_t*,      \
                                   const int32_t*, const int32_t*, const int32_t*, int, int, int, int, int,     \
                                   const ops::Ctx&);                                                            \
  template void attention_delta<S>(float*, const S*, const S*, int, int, int, int, const ops::Ctx&);           \
  template void flash_block_bwd<S>(float*, float*, float*, int, const S*, const S*, int, const S*, const S*,    \
                                   int, const float*, const float*, const int32_t*, const int32_t*,             \
                                   const int32_t*, const int32_t*, int, int, int, int, int, const ops::Ctx&);   \
  template void copy_columns<S>(S*, int64_t, const S*, int64_t, int64_t, int64_t, const ops::Ctx&);
MT_FLASH_BLOCK_INSTANTIATE(float)
MT_FLASH_BLOCK_INSTANTIATE(bf16)
MT_FLASH_BLOCK_INSTANTIATE(f16)
#undef MT_FLASH_BLOCK_INSTANTIATE

}  // namespace mt::cuda
