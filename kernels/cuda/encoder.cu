// Token + position embedding: forward gather and a deterministic backward scatter-add. Embeddings and
// dout are in the storage type S; out = wte + wpe is added in fp32 and rounded once; the gradients
// dwte, dwpe are fp32 and accumulate.
//
// The backward must add the rows of dout that share a token (or a position) into one row of dwte
// (dwpe). Atomics would make the summation order, and so the low bits, vary from run to run. Instead
// the (key, row) pairs are sorted by key with CUB's radix sort, which is stable, so each key's rows
// form a run in ascending row order; the block at the start of a run adds the run's rows in that
// order and adds their sum once. Cost: a sort of B T pairs and one pass over dout, where scanning all
// rows for each distinct key (the earlier kernel) cost O((B T)^2) key reads, milliseconds per step at
// B T = 32k tokens.
//
// The vocabulary-parallel embedding (tensor parallelism: this rank holds rows [row0, row0 + rows) of
// wte) is the same gather and scatter with ids outside the rows giving zero rows and no gradient.
#if defined(MT_CUDA_SIM)
#include "sim/cub_radix_sort.h"  // CUB's headers hold device code the host compiler cannot build
#else
#include <cub/device/device_radix_sort.cuh>
#endif

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/encoder_kernels.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/cuda/stream_temp.cuh"
#include "kernels/cuda/vocab_parallel_kernels.cuh"

namespace mt::cuda {

using namespace encoder_kernels;

template <class S>
void encoder_fwd(S* out, const int32_t* tokens, const int32_t* pos, const S* wte, const S* wpe, int B, int T, int C,
                 const ops::Ctx& ctx) {
  const int64_t total = int64_t(B) * T * C;
  if (total == 0) return;
  const LaunchShape l = fwd_shape(total);
  MT_LAUNCH(l, stream_of(ctx), encoder_fwd_kernel<dev_t<S>>)(
      dev_ptr(out), tokens, pos, dev_ptr(wte), dev_ptr(wpe), T, C, total);
  MT_CUDA_CHECK_LAUNCH();
}

namespace {

// dst[key(r) - row0] += src[r] for every row r whose key lies in [row0, row0 + limit), summed per key
// in row order (see the top of the file). The pairs and CUB's temporary storage are stream-ordered
// temporaries.
template <class D>
void scatter_rows(float* dst, const D* src, const int32_t* keys, int rows, int T, int C, cudaStream_t stream,
                  int row0 = 0, int limit = INT32_MAX) {
  const size_t n = size_t(rows);
  const StreamTemp<uint32_t> keys_in(n, stream), keys_out(n, stream);
  const StreamTemp<int32_t> rows_in(n, stream), rows_out(n, stream);
  const LaunchShape lp = pairs_shape(rows);
  MT_LAUNCH(lp, stream, sort_pairs_kernel)(keys_in.get(), rows_in.get(), keys, rows, T, row0, limit);
  MT_CUDA_CHECK_LAUNCH();
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.get(), keys_out.get(), rows_in.get(),
                                                rows_out.get(), rows, 0, 32, stream));
  const StreamTemp<char> temp(temp_bytes, stream);
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, keys_in.get(), keys_out.get(), rows_in.get(),
                                                rows_out.get(), rows, 0, 32, stream));
  const LaunchShape lr = runs_shape(rows, C);
  MT_LAUNCH(lr, stream, sum_runs_kernel<D>)(dst, src, keys_out.get(), rows_out.get(), rows, C);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <class S>
void encoder_bwd(float* dwte, float* dwpe, const S* dout, const int32_t* tokens, const int32_t* pos, int B, int T,
                 int C, const ops::Ctx& ctx) {
  const int rows = B * T;
  if (rows == 0 || C == 0) return;
  if (dwte) scatter_rows(dwte, dev_ptr(dout), tokens, rows, T, C, stream_of(ctx));
  if (dwpe) scatter_rows(dwpe, dev_ptr(dout), pos, rows, T, C, stream_of(ctx));
}

template <class S>
void embedding_fwd(S* out, const int32_t* ids, const S* table, int row0, int rows, int N, int C,
                   const ops::Ctx& ctx) {
  const int64_t total = int64_t(N) * C;
  if (total == 0) return;
  const LaunchShape l = vocab_parallel_kernels::embedding_shape(total);
  MT_LAUNCH(l, stream_of(ctx), vocab_parallel_kernels::embedding_fwd_kernel<dev_t<S>>)(
      dev_ptr(out), ids, dev_ptr(table), row0, rows, C, total);
  MT_CUDA_CHECK_LAUNCH();
}

template <class S>
void embedding_bwd(float* dtable, const S* dout, const int32_t* ids, int row0, int rows, int N, int C,
                   const ops::Ctx& ctx) {
  if (N == 0 || C == 0 || rows == 0) return;
  // T only matters for position keys (ids null), which an embedding never uses.
  scatter_rows(dtable, dev_ptr(dout), ids, N, 1, C, stream_of(ctx), row0, rows);
}

#define MT_ENCODER_INSTANTIATE(S)                                                                             \
  template void encoder_fwd<S>(S*, const int32_t*, const int32_t*, const S*, const S*, int, int, int,          \
                               const ops::Ctx&);                                                              \
  template void encoder_bwd<S>(float*, float*, const S*, const int32_t*, const int32_t*, int, int, int,        \
                               const ops::Ctx&);                                                              \
  template void embedding_fwd<S>(S*, const int32_t*, const S*, int, int, int, int, const ops::Ctx&);          \
  template void embedding_bwd<S>(float*, const S*, const int32_t*, int, int, int, int, const ops::Ctx&);
MT_ENCODER_INSTANTIATE(float)
MT_ENCODER_INSTANTIATE(bf16)
MT_ENCODER_INSTANTIATE(f16)
#undef MT_ENCODER_INSTANTIATE

}  // namespace mt::cuda
