// Element-wise ops: add, GELU forward/backward and convert on storage types; scale and round_to on fp32.
// All are grid-stride loops over int64 indices, one element per thread per iteration; each loads its
// inputs into fp32, computes, and rounds once on store (storage.cuh).
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda {

using namespace elementwise_kernels;

template <class S>
void add(S* out, const S* a, const S* b, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  const LaunchShape l = elementwise_shape(N);
  MT_LAUNCH(l, stream_of(ctx), add_kernel<dev_t<S>>)(dev_ptr(out), dev_ptr(a), dev_ptr(b), N);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void gelu_fwd(S* out, const S* inp, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  const LaunchShape l = elementwise_shape(N);
  MT_LAUNCH(l, stream_of(ctx), gelu_fwd_kernel<dev_t<S>>)(dev_ptr(out), dev_ptr(inp), N);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void gelu_bwd(S* dinp, const S* dout, const S* inp, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  const LaunchShape l = elementwise_shape(N);
  MT_LAUNCH(l, stream_of(ctx), gelu_bwd_kernel<dev_t<S>>)(dev_ptr(dinp), dev_ptr(dout), dev_ptr(inp), N);
  MT_CUDA_CHECK_LAUNCH();
}

template <class D, class S>
void convert(D* out, const S* in, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  if constexpr (std::is_same_v<D, S>) {
    if (static_cast<const void*>(out) == static_cast<const void*>(in)) return;
    MT_CUDA_CHECK(cudaMemcpyAsync(out, in, size_t(N) * sizeof(S), cudaMemcpyDeviceToDevice, stream_of(ctx)));
  } else {
    const LaunchShape l = elementwise_shape(N);
    MT_LAUNCH(l, stream_of(ctx), convert_kernel<dev_t<D>, dev_t<S>>)(dev_ptr(out), dev_ptr(in), N);
    MT_CUDA_CHECK_LAUNCH();
  }
}

void scale(float* x, float s, int64_t N, const ops::Ctx& ctx) {
  if (N <= 0) return;
  const LaunchShape l = elementwise_shape(N);
  MT_LAUNCH(l, stream_of(ctx), scale_kernel)(x, s, N);
  MT_CUDA_CHECK_LAUNCH();
}

void round_to(float* x, int64_t N, DType t, const ops::Ctx& ctx) {
  MT_CHECK(t == DType::f32 || t == DType::bf16 || t == DType::f16, "round_to: %s is not a floating-point type",
           dtype_name(t));
  if (N <= 0 || t == DType::f32) return;
  const LaunchShape l = elementwise_shape(N);
  if (t == DType::bf16)
    MT_LAUNCH(l, stream_of(ctx), round_bf16_kernel)(x, N);
  else
    MT_LAUNCH(l, stream_of(ctx), round_f16_kernel)(x, N);
  MT_CUDA_CHECK_LAUNCH();
}

#define MT_ELEMENTWISE_INSTANTIATE(S)                                                \
  template void add<S>(S*, const S*, const S*, int64_t, const ops::Ctx&);            \
  template void gelu_fwd<S>(S*, const S*, int64_t, const ops::Ctx&);                 \
  template void gelu_bwd<S>(S*, const S*, const S*, int64_t, const ops::Ctx&);       \
  template void convert<S, float>(S*, const float*, int64_t, const ops::Ctx&);
MT_ELEMENTWISE_INSTANTIATE(float)
MT_ELEMENTWISE_INSTANTIATE(bf16)
MT_ELEMENTWISE_INSTANTIATE(f16)
#undef MT_ELEMENTWISE_INSTANTIATE
template void convert<float, bf16>(float*, const bf16*, int64_t, const ops::Ctx&);
template void convert<float, f16>(float*, const f16*, int64_t, const ops::Ctx&);

}  // namespace mt::cuda
