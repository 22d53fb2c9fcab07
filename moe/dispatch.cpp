#include "moe/dispatch.h"

#include <cmath>

#include "runtime/check.h"
#include "runtime/storage.h"

namespace mt::moe {

int64_t expert_capacity(double factor, int N, int K, int E) {
  MT_CHECK(factor >= 0 && E > 0, "expert_capacity: factor %g, %d experts", factor, E);
  if (factor == 0) return -1;
  return int64_t(std::ceil(factor * double(N) * K / E));
}

DispatchPlan plan_dispatch(const int32_t* expert, int N, int K, int E, int64_t capacity) {
  DispatchPlan p;
  p.N = N, p.K = K, p.E = E, p.capacity = capacity;
  const int64_t A = int64_t(N) * K;
  // Counting sort by expert, stable in a; the first `capacity` of each expert are kept.
  std::vector<int64_t> kept(size_t(E), 0);
  p.row_of.assign(size_t(A), -1);
  for (int64_t a = 0; a < A; a++) {
    const int e = expert[a];
    MT_CHECK(e >= 0 && e < E, "plan_dispatch: assignment %lld goes to expert %d of %d", (long long)a, e, E);
    if (capacity >= 0 && kept[size_t(e)] >= capacity) {
      p.dropped++;
      continue;
    }
    p.row_of[size_t(a)] = int32_t(kept[size_t(e)]++);  // the position within the expert, for now
  }
  p.offset.assign(size_t(E) + 1, 0);
  for (int e = 0; e < E; e++) p.offset[size_t(e) + 1] = p.offset[size_t(e)] + kept[size_t(e)];
  p.assignment_of.assign(size_t(p.rows()), -1);
  for (int64_t a = 0; a < A; a++) {
    if (p.row_of[size_t(a)] < 0) continue;
    p.row_of[size_t(a)] += int32_t(p.offset[size_t(expert[a])]);
    p.assignment_of[size_t(p.row_of[size_t(a)])] = int32_t(a);
  }
  return p;
}

template <class S>
void permute(S* out, const S* x, const DispatchPlan& p, int C) {
  const int64_t M = p.rows();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < M; r++) {
    const S* src = x + int64_t(p.token_of(r)) * C;
    S* dst = out + r * C;
    for (int c = 0; c < C; c++) dst[c] = src[c];
  }
}

template <class S>
void unpermute(S* out, const S* rows, const DispatchPlan& p, int C) {
  const int64_t A = int64_t(p.N) * p.K;
#pragma omp parallel for schedule(static)
  for (int64_t a = 0; a < A; a++) {
    S* dst = out + a * C;
    const int32_t r = p.row_of[size_t(a)];
    for (int c = 0; c < C; c++) dst[c] = r < 0 ? store_as<S>(0) : rows[int64_t(r) * C + c];
  }
}

template <class S>
void permute_backward(S* dx, const S* drows, const float* extra, const DispatchPlan& p, int C) {
  const int K = p.K;
#pragma omp parallel
  {
    std::vector<acc_t<S>> acc(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int t = 0; t < p.N; t++) {
      for (int c = 0; c < C; c++) acc[size_t(c)] = extra ? extra[int64_t(t) * C + c] : 0.f;
      for (int j = 0; j < K; j++) {
        const int32_t r = p.row_of[size_t(t) * K + j];
        if (r < 0) continue;
        const S* src = drows + int64_t(r) * C;
        for (int c = 0; c < C; c++) acc[size_t(c)] += load(src[c]);
      }
      S* dst = dx + int64_t(t) * C;
      for (int c = 0; c < C; c++) dst[c] = store_as<S>(acc[size_t(c)]);
    }
  }
}

template <class S>
void combine(S* y, const S* rows, const float* gate, const S* base, const DispatchPlan& p, int C) {
  const int K = p.K;
#pragma omp parallel
  {
    std::vector<acc_t<S>> acc(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int t = 0; t < p.N; t++) {
      for (int c = 0; c < C; c++) acc[size_t(c)] = base ? load(base[int64_t(t) * C + c]) : acc_t<S>(0);
      for (int j = 0; j < K; j++) {
        const int64_t a = int64_t(t) * K + j;
        const int32_t r = p.row_of[size_t(a)];
        if (r < 0) continue;
        const acc_t<S> g = gate[a];
        const S* src = rows + int64_t(r) * C;
        for (int c = 0; c < C; c++) acc[size_t(c)] += g * load(src[c]);
      }
      S* dst = y + int64_t(t) * C;
      for (int c = 0; c < C; c++) dst[c] = store_as<S>(acc[size_t(c)]);
    }
  }
}

template <class S>
void combine_backward(S* drows, float* dgate, const S* dy, const S* rows, const float* gate, const DispatchPlan& p,
                      int C) {
  const int64_t A = int64_t(p.N) * p.K;
#pragma omp parallel for schedule(static)
  for (int64_t a = 0; a < A; a++) {
    const int32_t r = p.row_of[size_t(a)];
    if (r < 0) {
      dgate[a] = 0.f;
      continue;
    }
    const S* d = dy + (a / p.K) * C;
    const S* src = rows + int64_t(r) * C;
    S* dst = drows + int64_t(r) * C;
    const acc_t<S> g = gate[a];
    double dot = 0;
    for (int c = 0; c < C; c++) {
      const acc_t<S> dv = load(d[c]);
      dot += double(dv) * double(load(src[c]));
      dst[c] = store_as<S>(g * dv);
    }
    dgate[a] = float(dot);
  }
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
