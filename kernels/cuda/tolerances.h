// The CUDA-vs-CPU tolerance table, shared by the GPU unit tests and `minitrain selftest`.
// Each entry bounds max |cuda - cpu| / max |cpu| over an op's output. The backends differ only in
// summation order (GEMMs, row and column reductions), in FMA contraction (nvcc contracts, the CPU
// build does not) and in the CPU's polynomial exp; fp32 rounding of a K-term sum differs by about
// sqrt(K) * 2^-24 relative, about 3e-6 at K = 3072. Each entry sits above that and orders of
// magnitude below what a wrong index, mask or formula produces (errors of order 1). Not yet
// confirmed on a GPU.
#pragma once

namespace mt::cuda::tol {
inline constexpr double kExact = 0.0;        // encoder_fwd, add, scale: one IEEE operation per element
inline constexpr double kEncoderBwd = 1e-6;  // sums of a few rows
inline constexpr double kLayerNorm = 1e-5;
inline constexpr double kMatmul = 1e-5;
inline constexpr double kGelu = 1e-5;
inline constexpr double kAttentionFwd = 1e-5;
inline constexpr double kAttentionBwd = 5e-5;  // three GEMMs and a softmax backward in a chain
inline constexpr double kSoftmaxXent = 1e-5;
inline constexpr double kAdamW = 1e-6;
inline constexpr double kSumSquares = 1e-11;  // double accumulation of exact squares, different order
}  // namespace mt::cuda::tol
