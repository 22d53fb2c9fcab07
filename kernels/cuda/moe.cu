// The mixture-of-experts ops on the GPU (kernels/ops.h has their semantics, moe/ the layer): the
// router's softmax and top-k, its statistics and backward, the dispatch plan, and the permute /
// unpermute / combine moves with their backwards. The kernels are in moe_kernels.cuh (also built
// against the warp emulator by tests/test_emu_moe.cpp), the CPU twins in kernels/cpu/moe.cpp. The
// experts' GEMMs are the matmul op, one call per expert with rows (moe/experts.h).
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/moe_kernels.cuh"
#include "kernels/cuda/storage.cuh"
#include "runtime/check.h"

namespace mt::cuda {

using namespace moe_kernels;

void moe_route(float* probs, float* lse, double* lse_sq, int32_t* expert, float* gate, const float* logits,
               const float* bias, int N, int E, int K, const ops::Ctx& ctx) {
  if (N == 0) return;
  const LaunchShape l = items_shape(N);
  MT_LAUNCH(l, stream_of(ctx), route_kernel)(probs, lse, lse_sq, expert, gate, logits, bias, N, E, K);
  MT_CUDA_CHECK_LAUNCH();
}

void moe_route_stats(double* sums, const float* probs, const double* lse_sq, int N, int E, const ops::Ctx& ctx) {
  const LaunchShape l = stats_shape(E);
  MT_LAUNCH(l, stream_of(ctx), route_stats_kernel)(sums, probs, lse_sq, N, E);
  MT_CUDA_CHECK_LAUNCH();
}

void moe_route_bwd(float* dlogits, const float* dgate, const float* probs, const float* lse, const int32_t* expert,
                   const float* gate, const int32_t* load, int N, int E, int K, double aux_weight, double z_weight,
                   const ops::Ctx& ctx) {
  if (N == 0) return;
  const LaunchShape l = items_shape(N);
  MT_LAUNCH(l, stream_of(ctx), route_bwd_kernel)(
      dlogits, dgate, probs, lse, expert, gate, load, N, E, K, aux_weight, z_weight);
  MT_CUDA_CHECK_LAUNCH();
}

void moe_plan(int32_t* load, int32_t* offset, int32_t* row_of, int32_t* assignment_of, const int32_t* expert, int N,
              int K, int E, int64_t capacity, const ops::Ctx& ctx) {
  const int64_t A = int64_t(N) * K;
  const cudaStream_t s = stream_of(ctx);
  const LaunchShape c = plan_count_shape(E), o = single_shape(), r = items_shape(A);
  MT_LAUNCH(c, s, plan_count_kernel)(load, row_of, expert, A);
  MT_CUDA_CHECK_LAUNCH();
  MT_LAUNCH(o, s, plan_offsets_kernel)(offset, load, E, capacity);
  MT_CUDA_CHECK_LAUNCH();
  if (A == 0) return;
  MT_LAUNCH(r, s, plan_rows_kernel)(row_of, assignment_of, expert, offset, A, capacity);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void moe_permute(S* out, const S* x, const int32_t* assignment_of, int64_t M, int K, int C, const ops::Ctx& ctx) {
  const int64_t total = M * C;
  if (total == 0) return;
  const LaunchShape l = items_shape(total);
  MT_LAUNCH(l, stream_of(ctx), permute_kernel<dev_t<S>>)(dev_ptr(out), dev_ptr(x), assignment_of, K, C, total);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void moe_unpermute(S* out, const S* rows, const int32_t* row_of, int64_t A, int C, const ops::Ctx& ctx) {
  const int64_t total = A * C;
  if (total == 0) return;
  const LaunchShape l = items_shape(total);
  MT_LAUNCH(l, stream_of(ctx), unpermute_kernel<dev_t<S>>)(dev_ptr(out), dev_ptr(rows), row_of, C, total);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void moe_permute_bwd(S* dx, const S* drows, const float* extra, const int32_t* row_of, int N, int K, int C,
                     const ops::Ctx& ctx) {
  const int64_t total = int64_t(N) * C;
  if (total == 0) return;
  const LaunchShape l = items_shape(total);
  MT_LAUNCH(l, stream_of(ctx), permute_bwd_kernel<dev_t<S>>)(dev_ptr(dx), dev_ptr(drows), extra, row_of, K, C, total);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void moe_combine(S* y, const S* rows, const float* gate, const S* base, const int32_t* row_of, int N, int K, int C,
                 const ops::Ctx& ctx) {
  const int64_t total = int64_t(N) * C;
  if (total == 0) return;
  const LaunchShape l = items_shape(total);
  MT_LAUNCH(l, stream_of(ctx), combine_kernel<dev_t<S>>)(
      dev_ptr(y), dev_ptr(rows), gate, dev_ptr(base), row_of, K, C, total);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void moe_combine_bwd(S* drows, float* dgate, const S* dy, const S* rows, const float* gate, const int32_t* row_of,
                     const int32_t* assignment_of, int64_t M, int N, int K, int C, const ops::Ctx& ctx) {
  const int64_t A = int64_t(N) * K;
  if (A == 0) return;
  const cudaStream_t s = stream_of(ctx);
  if (M > 0) {
    const LaunchShape r = items_shape(M * C);
    MT_LAUNCH(r, s, combine_bwd_rows_kernel<dev_t<S>>)(dev_ptr(drows), dev_ptr(dy), gate, assignment_of, K, C, M * C);
    MT_CUDA_CHECK_LAUNCH();
  }
  const LaunchShape g = items_shape(A);
  MT_LAUNCH(g, s, combine_bwd_gate_kernel<dev_t<S>>)(dgate, dev_ptr(dy), dev_ptr(rows), row_of, K, C, A);
  MT_CUDA_CHECK_LAUNCH();
}

#define MT_MOE_INSTANTIATE(S)                                                                                       \
  template void moe_permute<S>(S*, const S*, const int32_t*, int64_t, int, int, const ops::Ctx&);                   \
  template void moe_unpermute<S>(S*, const S*, const int32_t*, int64_t, int, const ops::Ctx&);                      \
  template void moe_permute_bwd<S>(S*, const S*, const float*, const int32_t*, int, int, int, const ops::Ctx&);     \
  template void moe_combine<S>(S*, const S*, const float*, const S*, const int32_t*, int, int, int,                 \
                               const ops::Ctx&);                                                                    \
  template void moe_combine_bwd<S>(S*, float*, const S*, const S*, const float*, const int32_t*, const int32_t*,    \
                                   int64_t, int, int, int, const ops::Ctx&);
MT_MOE_INSTANTIATE(float)
MT_MOE_INSTANTIATE(bf16)
MT_MOE_INSTANTIATE(f16)
#undef MT_MOE_INSTANTIATE

}  // namespace mt::cuda
