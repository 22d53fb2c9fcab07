// Token + position embedding lookup (forward) and its scatter-add (backward).
//
// The backward adds each row of dout into the rows of dwte/dwpe its token/position picked. Repeated
// tokens make this a scatter with collisions, so instead of splitting over rows (races or atomics)
// each thread owns a slice of channels and walks all rows in order: no races, and every sum runs in
// the same order whatever the thread count.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {
// Channels per backward work item: 64 floats = one 256-byte strip per row.
constexpr int kChannelBlock = 64;
}  // namespace

template <class T>
void encoder_fwd(T* out, const int32_t* tokens, const int32_t* pos, const T* wte, const T* wpe, int B, int T_, int C) {
  const int64_t N = int64_t(B) * T_;
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (int64_t n = 0; n < N; n++) {
    const int64_t p = pos ? pos[n] : n % T_;
    const T* te = wte + int64_t(tokens[n]) * C;
    const T* pe = wpe + p * C;
    T* o = out + n * C;
    for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
  }
}

template <class T>
void encoder_bwd(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, const int32_t* pos, int B, int T_, int C) {
  const int64_t N = int64_t(B) * T_;
  const int blocks = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for schedule(static) if (parallel_worth(N * C))
  for (int cb = 0; cb < blocks; cb++) {
    const int c0 = cb * kChannelBlock, c1 = std::min(C, c0 + kChannelBlock);
    for (int64_t n = 0; n < N; n++) {
      const int64_t p = pos ? pos[n] : n % T_;
      const T* d = dout + n * C;
      T* te = dwte + int64_t(tokens[n]) * C;
      T* pe = dwpe + p * C;
      for (int c = c0; c < c1; c++) {
        te[c] += d[c];
        pe[c] += d[c];
      }
    }
  }
}

template void encoder_fwd<float>(float*, const int32_t*, const int32_t*, const float*, const float*, int, int, int);
template void encoder_fwd<double>(double*, const int32_t*, const int32_t*, const double*, const double*, int, int, int);
template void encoder_bwd<float>(float*, float*, const float*, const int32_t*, const int32_t*, int, int, int);
template void encoder_bwd<double>(double*, double*, const double*, const int32_t*, const int32_t*, int, int, int);

}  // namespace mt::cpu
