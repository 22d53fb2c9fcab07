// Elementwise ops: the residual add.
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

// out = a + b; out may alias a or b (each element is read before it is written).
template <class T>
void add(T* out, const T* a, const T* b, int64_t N) {
#pragma omp parallel for schedule(static) if (parallel_worth(N))
  for (int64_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

template void add<float>(float*, const float*, const float*, int64_t);
template void add<double>(double*, const double*, const double*, int64_t);

}  // namespace mt::cpu
