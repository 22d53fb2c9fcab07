// Elementwise ops: the residual add and the conversions between storage types.
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

// out = round(a + b) with the sum in A; out may alias a or b (each element is read before it is
// written).
template <class S>
void add(S* out, const S* a, const S* b, int64_t N) {
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t i = 0; i < N; i++) out[i] = store_as<S>(load(a[i]) + load(b[i]));
}

// Widening is exact; narrowing rounds to nearest, ties to even, keeps NaN a NaN and overflows to
// +-inf (fp16 above 65504), as the GPU's conversion instructions do (runtime/dtype.h).
template <class D, class S>
void convert(D* out, const S* in, int64_t N) {
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t i = 0; i < N; i++) out[i] = store_as<D>(load(in[i]));
}

template void add<float>(float*, const float*, const float*, int64_t);
template void add<double>(double*, const double*, const double*, int64_t);
template void add<bf16>(bf16*, const bf16*, const bf16*, int64_t);
template void add<f16>(f16*, const f16*, const f16*, int64_t);

template void convert<float, float>(float*, const float*, int64_t);
template void convert<bf16, float>(bf16*, const float*, int64_t);
template void convert<f16, float>(f16*, const float*, int64_t);
template void convert<float, bf16>(float*, const bf16*, int64_t);
template void convert<float, f16>(float*, const f16*, int64_t);

}  // namespace mt::cpu
