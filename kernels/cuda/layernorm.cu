// LayerNorm over the last dimension (Ba, Kiros & Hinton 2016), eps = 1e-5, one warp per row, on
// storage type S with fp32 statistics.
//
// Forward: mean = sum(x)/C, var = sum((x - mean)^2)/C (two passes, no E[x^2] - mean^2 cancellation),
// rstd = 1/sqrt(var + eps), out = (x - mean) rstd w + b, rounded once to S. Where the pointers are
// 16-byte aligned and C a multiple of 16 bytes' worth of values (up to 2048 in 16-bit storage), each
// lane holds its part of the row in registers, read with 16-byte loads (layernorm_fwd_vec_kernel).
// The fused residual form first stores res = a + b (rounded to S) and normalises that stored value,
// so it gives exactly what add followed by layernorm_fwd gives.
// Backward with n = (x - mean) rstd and g = dout w:
//   dinp = [dinp +] rstd (g - mean(g) - n mean(g n))  (assigned, or added to the residual gradient
//                                                       already in dinp when `accumulate`; one rounding)
//   dweight += sum_rows dout n, dbias += sum_rows dout (fp32 parameter gradients accumulate)
// One kernel computes dinp and each block's partial parameter sums in the same pass over dout and inp
// (C up to 2048); the blocks' partials are then added in block order. Larger C takes a two-pass
// column sum (column_sum_kernels.cuh) and a dinp kernel. Fixed orders, no atomics. dinp may alias
// dout: each element is read before it is written by the same thread (in the fused kernel the row's
// parameter terms are taken in the first pass over the row, before its dinp is written).
#include <cstdint>

#include "kernels/cuda/column_sum.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/layernorm_kernels.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {
namespace {

using namespace layernorm_kernels;

}  // namespace

template <class S>
void layernorm_fwd(S* out, float* mean, float* rstd, const S* inp, const S* weight, const S* bias, int N, int C,
                   const ops::Ctx& ctx) {
  if (N == 0) return;
  MT_CHECK(C > 0, "layernorm_fwd: C must be positive (got %d)", C);
  using D = dev_t<S>;
  const LaunchShape l = rows_shape(N);
  cudaStream_t stream = stream_of(ctx);
  if (aligned16({out, inp, weight, bias}) &&
      with_chunks_per_lane<D>(C, [&](auto chunks) {
        MT_LAUNCH(l, stream, layernorm_fwd_vec_kernel<D, decltype(chunks)::value>)(
            nullptr, dev_ptr(out), mean, rstd, dev_ptr(inp), nullptr, dev_ptr(weight), dev_ptr(bias), N, C);
      })) {
    MT_CUDA_CHECK_LAUNCH();
    return;
  }
  MT_LAUNCH(l, stream, layernorm_fwd_kernel<D>)(
      dev_ptr(out), mean, rstd, dev_ptr(inp), dev_ptr(weight), dev_ptr(bias), N, C);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void residual_layernorm_fwd(S* res, S* out, float* mean, float* rstd, const S* a, const S* b, const S* weight,
                            const S* bias, int N, int C, const ops::Ctx& ctx) {
  if (N == 0) return;
  MT_CHECK(C > 0, "residual_layernorm_fwd: C must be positive (got %d)", C);
  using D = dev_t<S>;
  const LaunchShape l = rows_shape(N);
  cudaStream_t stream = stream_of(ctx);
  if (aligned16({res, out, a, b, weight, bias}) &&
      with_chunks_per_lane<D>(C, [&](auto chunks) {
        MT_LAUNCH(l, stream, layernorm_fwd_vec_kernel<D, decltype(chunks)::value>)(
            dev_ptr(res), dev_ptr(out), mean, rstd, dev_ptr(a), dev_ptr(b), dev_ptr(weight), dev_ptr(bias), N, C);
      })) {
    MT_CUDA_CHECK_LAUNCH();
    return;
  }
  MT_LAUNCH(l, stream, residual_layernorm_fwd_kernel<D>)(
      dev_ptr(res), dev_ptr(out), mean, rstd, dev_ptr(a), dev_ptr(b), dev_ptr(weight), dev_ptr(bias), N, C);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void layernorm_bwd(S* dinp, float* dweight, float* dbias, const S* dout, const S* inp, const S* weight,
                   const float* mean, const float* rstd, int N, int C, bool accumulate, const ops::Ctx& ctx) {
  if (N == 0 || C == 0) return;
  using D = dev_t<S>;
  cudaStream_t stream = stream_of(ctx);
  D* dx = dev_ptr(dinp);
  const D *dy = dev_ptr(dout), *x = dev_ptr(inp), *w = dev_ptr(weight);
  const bool params = dweight || dbias;
  if (params && dinp && C <= kFusedMaxC) {
    // One pass for dinp and the parameter terms, then the blocks' partials added in order.
    const column_sum_kernels::ColumnSplit split = fused_split(N, C);
    const StreamTemp<float> partial(column_sum_kernels::partial_floats(split, 2), stream);
    with_cols_per_lane(C, [&](auto cols) {
      const LaunchShape l = fused_shape(N, C);
      MT_LAUNCH(l, stream, layernorm_bwd_kernel<D, decltype(cols)::value>)(
          dx, partial.get(), dy, x, w, mean, rstd, N, C, accumulate);
      MT_CUDA_CHECK_LAUNCH();
    });
    const LaunchShape f = column_sum_kernels::finish_shape(split);
    MT_LAUNCH(f, stream, column_sum_kernels::column_finish_kernel<2>)({{dweight, dbias}}, partial.get(), split);
    MT_CUDA_CHECK_LAUNCH();
    return;
  }
  // Wider rows, or only one of the two wanted: the column sums first (dinp may alias dout), then dinp.
  if (params) column_sums<2>({{dweight, dbias}}, ParamGradTerms<D>{dy, x, mean, rstd}, N, C, stream);
  if (dinp) {
    const LaunchShape l = rows_shape(N);
    MT_LAUNCH(l, stream, layernorm_bwd_dinp_kernel<D>)(dx, dy, x, w, mean, rstd, N, C, accumulate);
    MT_CUDA_CHECK_LAUNCH();
  }
}

#define MT_LAYERNORM_INSTANTIATE(S)                                                                            \
  template void layernorm_fwd<S>(S*, float*, float*, const S*, const S*, const S*, int, int, const ops::Ctx&);  \
  template void residual_layernorm_fwd<S>(S*, S*, float*, float*, const S*, const S*, const S*, const S*, int,  \
                                          int, const ops::Ctx&);                                               \
  template void layernorm_bwd<S>(S*, float*, float*, const S*, const S*, const S*, const float*, const float*,  \
                                 int, int, bool, const ops::Ctx&);
MT_LAYERNORM_INSTANTIATE(float)
MT_LAYERNORM_INSTANTIATE(bf16)
MT_LAYERNORM_INSTANTIATE(f16)
#undef MT_LAYERNORM_INSTANTIATE

}  // namespace mt::cuda
