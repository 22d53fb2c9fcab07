#include "moe/dispatch.h"

#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "runtime/check.h"
#include "runtime/storage.h"

namespace mt::moe {

int64_t expert_capacity(double factor, int N, int K, int E) {
  MT_CHECK(factor >= 0 && E > 0, "expert_capacity: factor %g, %d experts", factor, E);
  if (factor == 0) return -1;
  return int64_t(std::ceil(factor * double(N) * K / E));
}

DispatchPlan plan_dispatch(const int32_t* expert, int N, int K, int E, int64_t capacity) {
  const int64_t A = int64_t(N) * K;
  for (int64_t a = 0; a < A; a++)
    MT_CHECK(expert[a] >= 0 && expert[a] < E, "plan_dispatch: assignment %lld goes to expert %d of %d", (long long)a,
             expert[a], E);
  std::vector<int32_t> load(static_cast<size_t>(E)), offset(size_t(E) + 1), row_of(static_cast<size_t>(A)),
      assignment_of(static_cast<size_t>(A));
  cpu::moe_plan(load.data(), offset.data(), row_of.data(), assignment_of.data(), expert, N, K, E, capacity);
  DispatchPlan p;
  p.N = N, p.K = K, p.E = E, p.capacity = capacity;
  p.offset.assign(offset.begin(), offset.end());
  p.row_of = std::move(row_of);
  assignment_of.resize(size_t(p.rows()));
  p.assignment_of = std::move(assignment_of);
  p.dropped = A - p.rows();
  return p;
}

DispatchPlan plan_kept(const int32_t* expert, const uint8_t* keep, int N, int K, int E, int64_t capacity) {
  const int64_t A = int64_t(N) * K;
  DispatchPlan p;
  p.N = N, p.K = K, p.E = E, p.capacity = capacity;
  p.offset.assign(size_t(E) + 1, 0);
  for (int64_t a = 0; a < A; a++) {
    MT_CHECK(expert[a] >= 0 && expert[a] < E, "plan_kept: assignment %lld goes to expert %d of %d", (long long)a,
             expert[a], E);
    if (keep[a]) p.offset[size_t(expert[a]) + 1]++;
  }
  for (int e = 0; e < E; e++) p.offset[size_t(e) + 1] += p.offset[size_t(e)];
  std::vector<int64_t> next(p.offset.begin(), p.offset.end() - 1);
  p.row_of.assign(size_t(A), -1);
  p.assignment_of.assign(size_t(p.rows()), 0);
  for (int64_t a = 0; a < A; a++) {
    if (!keep[a]) continue;
    const int64_t r = next[size_t(expert[a])]++;
    p.row_of[size_t(a)] = int32_t(r);
    p.assignment_of[size_t(r)] = int32_t(a);
  }
  p.dropped = A - p.rows();
  return p;
}

template <class S>
void permute(S* out, const S* x, const DispatchPlan& p, int C) {
  cpu::moe_permute(out, x, p.assignment_of.data(), p.rows(), p.K, C);
}

template <class S>
void unpermute(S* out, const S* rows, const DispatchPlan& p, int C) {
  cpu::moe_unpermute(out, rows, p.row_of.data(), int64_t(p.N) * p.K, C);
}

template <class S>
void permute_backward(S* dx, const S* drows, const float* extra, const DispatchPlan& p, int C) {
  cpu::moe_permute_bwd(dx, drows, extra, p.row_of.data(), p.N, p.K, C);
}

template <class S>
void combine(S* y, const S* rows, const float* gate, const S* base, const DispatchPlan& p, int C) {
  cpu::moe_combine(y, rows, gate, base, p.row_of.data(), p.N, p.K, C);
}

template <class S>
void combine_backward(S* drows, float* dgate, const S* dy, const S* rows, const float* gate, const DispatchPlan& p,
                      int C) {
  cpu::moe_combine_bwd(drows, dgate, dy, rows, gate, p.row_of.data(), p.N, p.K, C);
}

#define MT_DISPATCH(S)                                                                                         \
  template void permute<S>(S*, const S*, const DispatchPlan&, int);                                            \
  template void unpermute<S>(S*, const S*, const DispatchPlan&, int);                                          \
  template void permute_backward<S>(S*, const S*, const float*, const DispatchPlan&, int);                     \
  template void combine<S>(S*, const S*, const float*, const S*, const DispatchPlan&, int);                    \
  template void combine_backward<S>(S*, float*, const S*, const S*, const float*, const DispatchPlan&, int);
MT_DISPATCH(float)
MT_DISPATCH(double)
MT_DISPATCH(bf16)
MT_DISPATCH(f16)
#undef MT_DISPATCH

}  // namespace mt::moe
