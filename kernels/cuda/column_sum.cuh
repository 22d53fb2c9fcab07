// The launcher of the two-pass column sums (column_sum_kernels.cuh), for the .cu files that need one:
// the bias gradient of matmul_bwd and the parameter gradients of layernorm_bwd.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/column_sum_kernels.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/stream_temp.cuh"

namespace mt::cuda {

// outs[k][c] += sum over the R rows of term's k-th value at (r, c). The partials (splits x C floats per
// sum) live in a stream-ordered temporary.
template <int K, class Term>
void column_sums(column_sum_kernels::ColumnOutputs<K> outs, Term term, int R, int C, cudaStream_t stream) {
  namespace csk = column_sum_kernels;
  if (R <= 0 || C <= 0) return;
  const csk::ColumnSplit s = csk::column_split(R, C);
  const StreamTemp<float> partial(csk::partial_floats(s, K), stream);
  const LaunchShape p = csk::partials_shape(s), f = csk::finish_shape(s);
  MT_LAUNCH(p, stream, csk::column_partials_kernel<K, Term>)(partial.get(), term, s);
  MT_CUDA_CHECK_LAUNCH();
  MT_LAUNCH(f, stream, csk::column_finish_kernel<K>)(outs, partial.get(), s);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
