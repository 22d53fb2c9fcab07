// The CUDA-vs-CPU tolerance table, shared by the GPU unit tests and `minitrain selftest`.
//
// Each entry bounds max |cuda - cpu| / max |cpu| over one output of an op, for each storage type the
// op ran in (both backends get the same S inputs). The backends differ in summation order (GEMMs, row
// and column reductions), in FMA contraction (nvcc contracts, the CPU build does not) and in exp/tanh
// implementations; in fp32 that moves a K-term sum by about sqrt(K) * 2^-24 relative, about 3e-6 at
// K = 3072. An output stored in bf16/fp16 is rounded once from those nearly equal fp32 values, and
// when they straddle a rounding boundary the stored values differ by one unit in the last place:
// at most 2^-7 of the output's largest magnitude for bf16 (8 significant bits), 2^-10 for fp16 (11).
// The 16-bit entries allow two such units (three after a chain of stored intermediates); fp32
// outputs of 16-bit inputs (parameter gradients, statistics, losses) keep fp32-sized bounds, as the
// inputs are the same exact values on both sides. Every entry sits orders of magnitude below what a
// wrong index, mask or formula produces (errors of order 1). Not yet confirmed on a GPU.
#pragma once

#include "runtime/dtype.h"
#include "runtime/storage.h"

namespace mt::cuda::tol {

struct Tolerance {
  double f32, bf16, f16;
  constexpr double operator()(DType t) const { return t == DType::bf16 ? bf16 : t == DType::f16 ? f16 : f32; }
  template <class S>
  constexpr double of() const {
    return (*this)(dtype_of<S>());
  }
};

// One unit in the last place of a 16-bit value, relative to the largest magnitude in its output.
inline constexpr double kBf16Ulp = 1.0 / 128;  // 2^-7
inline constexpr double kF16Ulp = 1.0 / 1024;  // 2^-10

// One IEEE operation on the same inputs, one rounding: bit-identical (encoder_fwd, add, residual sum,
// convert, scale).
inline constexpr Tolerance kExact{0.0, 0.0, 0.0};
inline constexpr Tolerance kEncoderBwd{1e-6, 1e-6, 1e-6};  // fp32 sums of a few rows
inline constexpr Tolerance kLayerNorm{1e-5, 2 * kBf16Ulp, 2 * kF16Ulp};
inline constexpr Tolerance kLayerNormStats{1e-5, 1e-5, 1e-5};  // mean, rstd (fp32)
inline constexpr Tolerance kLayerNormParamGrads{1e-5, 1e-5, 1e-5};
inline constexpr Tolerance kMatmul{1e-5, 2 * kBf16Ulp, 2 * kF16Ulp};
// dweight, dbias (fp32). 16-bit products are exact, but tensor cores add them in their own order and
// alignment, so the 16-bit runs get a wider fp32 bound.
inline constexpr Tolerance kMatmulParamGrads{1e-5, 1e-4, 1e-4};
// The GELU epilogues run inside cuBLASLt, whose GELU evaluation (tanh form) is not documented to be
// accurate to fp32 rounding; the fp32 bound allows an approximate tanh. Unconfirmed.
inline constexpr Tolerance kMatmulGelu{2e-4, 2 * kBf16Ulp, 2 * kF16Ulp};
inline constexpr Tolerance kGelu{1e-5, 2 * kBf16Ulp, 2 * kF16Ulp};
inline constexpr Tolerance kAttentionFwd{1e-5, 3 * kBf16Ulp, 3 * kF16Ulp};  // att, then out = att V
inline constexpr Tolerance kAttentionBwd{5e-5, 3 * kBf16Ulp, 3 * kF16Ulp};  // GEMMs and a softmax backward
inline constexpr Tolerance kFlashFwd{2e-5, 3 * kBf16Ulp, 3 * kF16Ulp};      // online softmax rescaling
inline constexpr Tolerance kFlashLse{1e-5, 1e-5, 1e-5};                    // fp32
inline constexpr Tolerance kFlashBwd{5e-5, 3 * kBf16Ulp, 3 * kF16Ulp};
inline constexpr Tolerance kSoftmaxXentLoss{1e-5, 1e-5, 1e-5};  // fp32 losses
inline constexpr Tolerance kSoftmaxXentGrad{1e-5, 2 * kBf16Ulp, 2 * kF16Ulp};

// fp32-only ops.
inline constexpr double kAdamW = 1e-6;
inline constexpr double kSumSquares = 1e-11;  // double accumulation of exact squares, different order

}  // namespace mt::cuda::tol
