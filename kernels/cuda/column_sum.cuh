// The launcher of the two-pass column sums (column_sum_kernels.cuh), for the .cu files that need one:
// the bias gradient of matmul_bwd and the parameter gradients of layernorm_bwd.
#pragma once
#include <cuda_runtime.h>

#include "kernels/cuda/column_sum_kernels.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"

namespace mt::cuda {

// outs[k][c] += sum over the R rows of term's k-th value at (r, c). The partials live in a stream-ordered
// scratch buffer (splits x C floats per sum), freed after pass 2 on the same stream.
template <int K, class Term>
void column_sums(column_sum_kernels::ColumnOutputs<K> outs, Term term, int R, int C, cudaStream_t stream) {
  namespace csk = column_sum_kernels;
  if (R <= 0 || C <= 0) return;
  const csk::ColumnSplit s = csk::column_split(R, C);
  float* partial = nullptr;
  MT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial), csk::partial_floats(s, K) * sizeof(float), stream));
  try {
    const LaunchShape p = csk::partials_shape(s), f = csk::finish_shape(s);
    csk::column_partials_kernel<K, Term><<<p.grid, p.block, p.smem, stream>>>(partial, term, s);
    MT_CUDA_CHECK_LAUNCH();
    csk::column_finish_kernel<K><<<f.grid, f.block, f.smem, stream>>>(outs, partial, s);
    MT_CUDA_CHECK_LAUNCH();
  } catch (...) {
    (void)cudaFreeAsync(partial, stream);
    throw;
  }
  MT_CUDA_CHECK(cudaFreeAsync(partial, stream));
}

}  // namespace mt::cuda
