// Token + position embedding lookup (forward) and its scatter-add (backward).
//
// The forward adds in A and rounds once. The backward adds each row of dout into the rows of the
// fp32 (A) gradients dwte/dwpe its token/position picked. Repeated tokens make this a scatter with
// collisions, so instead of splitting over rows (races or atomics) each thread owns a slice of
// channels and walks all rows in order: no races, and every sum runs in the same order whatever the
// thread count.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {
// Channels per backward work item: 64 floats = one 256-byte strip per row.
constexpr int kChannelBlock = 64;
}  // namespace

template <class S>
void encoder_fwd(S* out, const int32_t* tokens, const int32_t* pos, const S* wte, const S* wpe, int B, int T_,
                 int C) {
  const int64_t N = int64_t(B) * T_;
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (int64_t n = 0; n < N; n++) {
    const int64_t p = pos ? pos[n] : n % T_;
    const S* te = wte + int64_t(tokens[n]) * C;
    const S* pe = wpe + p * C;
    S* o = out + n * C;
    for (int c = 0; c < C; c++) o[c] = store_as<S>(load(te[c]) + load(pe[c]));
  }
}

template <class S>
void encoder_bwd(acc_t<S>* dwte, acc_t<S>* dwpe, const S* dout, const int32_t* tokens, const int32_t* pos, int B,
                 int T_, int C) {
  using A = acc_t<S>;
  const int64_t N = int64_t(B) * T_;
  const int blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (int cb = 0; cb < blocks; cb++) {
    const int c0 = cb * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    for (int64_t n = 0; n < N; n++) {
      const int64_t p = pos ? pos[n] : n % T_;
      const S* d = dout + n * C;
      A* te = dwte + int64_t(tokens[n]) * C;
      A* pe = dwpe + p * C;
      for (int c = c0; c < c1; c++) {
        const A g = load(d[c]);
        te[c] += g;
        pe[c] += g;
      }
    }
  }
}

#define MT_ENCODER_INSTANTIATE(S)                                                                               \
  template void encoder_fwd<S>(S*, const int32_t*, const int32_t*, const S*, const S*, int, int, int);          \
  template void encoder_bwd<S>(acc_t<S>*, acc_t<S>*, const S*, const int32_t*, const int32_t*, int, int, int);
MT_ENCODER_INSTANTIATE(float)
MT_ENCODER_INSTANTIATE(double)
MT_ENCODER_INSTANTIATE(bf16)
MT_ENCODER_INSTANTIATE(f16)
#undef MT_ENCODER_INSTANTIATE

}  // namespace mt::cpu
