// Cross-entropy over a vocabulary split by columns across tensor-parallel ranks: each rank reduces its
// slice of every row to three statistics, the ranks all-gather them (the caller, over its
// communicator), and each rank merges them in rank order into the loss and its slice's gradient. The
// formulas are in kernels/cpu/vocab_parallel.cpp, the kernels in vocab_parallel_kernels.cuh. (The
// row-split embedding is in encoder.cu, beside the gather and scatter it shares.)
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/cuda/vocab_parallel_kernels.cuh"

namespace mt::cuda {

using namespace vocab_parallel_kernels;

template <class S>
void xent_slice_stats(float* stats, const S* logits, const int32_t* targets, int col0, int N, int V, int Vl,
                      const ops::Ctx& ctx) {
  MT_CHECK(V > 0 && Vl > 0 && col0 >= 0, "xent_slice_stats: bad slice col0=%d Vl=%d of V=%d", col0, Vl, V);
  if (N == 0) return;
  const LaunchShape l = slice_shape(N);
  MT_LAUNCH(l, stream_of(ctx), xent_slice_stats_kernel<dev_t<S>>)(stats, dev_ptr(logits), targets, col0, V, Vl);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void xent_slice_finish(float* losses, S* dlogits, const S* logits, const float* stats, int P, const int32_t* targets,
                       float dloss, int col0, int N, int V, int Vl, const ops::Ctx& ctx) {
  MT_CHECK(V > 0 && Vl > 0 && col0 >= 0 && P > 0, "xent_slice_finish: bad slice col0=%d Vl=%d of V=%d over %d ranks",
           col0, Vl, V, P);
  if (N == 0) return;
  const LaunchShape l = slice_shape(N);
  MT_LAUNCH(l, stream_of(ctx), xent_slice_finish_kernel<dev_t<S>>)(
      losses, dev_ptr(dlogits), dev_ptr(logits), stats, P, targets, dloss, col0, N, V, Vl);
  MT_CUDA_CHECK_LAUNCH();
}

#define MT_VOCAB_PARALLEL_INSTANTIATE(S)                                                                     \
  template void xent_slice_stats<S>(float*, const S*, const int32_t*, int, int, int, int, const ops::Ctx&); \
  template void xent_slice_finish<S>(float*, S*, const S*, const float*, int, const int32_t*, float, int, int, \
                                     int, int, const ops::Ctx&);
MT_VOCAB_PARALLEL_INSTANTIATE(float)
MT_VOCAB_PARALLEL_INSTANTIATE(bf16)
MT_VOCAB_PARALLEL_INSTANTIATE(f16)
#undef MT_VOCAB_PARALLEL_INSTANTIATE

}  // namespace mt::cuda
