// Token + position embedding: forward gather and a deterministic backward scatter-add. Embeddings and
// dout are in the storage type S; out = wte + wpe is added in fp32 and rounded once; the gradients
// dwte, dwpe are fp32 and accumulate.
//
// The backward must add the rows of dout that share a token (or a position) into one row of dwte
// (dwpe). Atomics would make the summation order, and so the low bits, vary from run to run. Instead
// the block that owns the FIRST occurrence of a key collects every row with that key, in row order, and
// adds their sum once; blocks owning later occurrences find an earlier match and leave at once.
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/encoder_kernels.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {

using namespace encoder_kernels;

template <class S>
void encoder_fwd(S* out, const int32_t* tokens, const int32_t* pos, const S* wte, const S* wpe, int B, int T, int C,
                 const ops::Ctx& ctx) {
  const int64_t total = int64_t(B) * T * C;
  if (total == 0) return;
  const LaunchShape l = fwd_shape(total);
  encoder_fwd_kernel<<<l.grid, l.block, l.smem, stream_of(ctx)>>>(dev_ptr(out), tokens, pos, dev_ptr(wte), dev_ptr(wpe),
                                                                  T, C, total);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void encoder_bwd(float* dwte, float* dwpe, const S* dout, const int32_t* tokens, const int32_t* pos, int B, int T,
                 int C, const ops::Ctx& ctx) {
  const int rows = B * T;
  if (rows == 0 || C == 0) return;
  const LaunchShape l = scatter_shape(rows, C);
  if (dwte) {
    scatter_rows_kernel<<<l.grid, l.block, l.smem, stream_of(ctx)>>>(dwte, dev_ptr(dout), tokens, rows, T, C);
    MT_CUDA_CHECK_LAUNCH();
  }
  if (dwpe) {
    scatter_rows_kernel<<<l.grid, l.block, l.smem, stream_of(ctx)>>>(dwpe, dev_ptr(dout), pos, rows, T, C);
    MT_CUDA_CHECK_LAUNCH();
  }
}

#define MT_ENCODER_INSTANTIATE(S)                                                                             \
  template void encoder_fwd<S>(S*, const int32_t*, const int32_t*, const S*, const S*, int, int, int,          \
                               const ops::Ctx&);                                                              \
  template void encoder_bwd<S>(float*, float*, const S*, const int32_t*, const int32_t*, int, int, int,        \
                               const ops::Ctx&);
MT_ENCODER_INSTANTIATE(float)
MT_ENCODER_INSTANTIATE(bf16)
MT_ENCODER_INSTANTIATE(f16)
#undef MT_ENCODER_INSTANTIATE

}  // namespace mt::cuda
