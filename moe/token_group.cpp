#include "moe/token_group.h"

#include "parallel/ring_attention.h"
#include "runtime/check.h"

namespace mt::moe {

namespace {
// `mine` (n elements of type t, `bytes` each) from every rank of the group, in rank order (tp inside
// cp): tp first (each tp rank's rows are a contiguous part of its cp rank's), then those blocks over cp.
template <class X>
std::vector<X> gather(const TokenGroup& g, const std::vector<X>& mine, DType t, size_t per_elem) {
  std::vector<X> over_tp = mine;
  if (g.tp_size() > 1) {
    over_tp.resize(mine.size() * size_t(g.tp_size()));
    g.tp->all_gather(mine.data(), over_tp.data(), mine.size() * per_elem, t);
  }
  if (g.cp_size() == 1) return over_tp;
  std::vector<X> all(over_tp.size() * size_t(g.cp_size()));
  g.cp->all_gather(over_tp.data(), all.data(), over_tp.size() * per_elem, t);
  return all;
}
}  // namespace

std::vector<int64_t> TokenGroup::token_index(int tp_rank, int cp_rank, int N) const {
  const int P = cp_size(), Tl = T / P;
  MT_CHECK(Tl * P == T && int64_t(N) * tp_size() == int64_t(B) * Tl,
           "token group: %d rows on each of %d tp x %d cp ranks for %d sequences of %d tokens", N, tp_size(), P, B, T);
  const parallel::Zigzag z{T, P, cp_rank};
  std::vector<int64_t> out(static_cast<size_t>(N));
  const int64_t first = tp_size() > 1 ? int64_t(tp_rank) * N : 0;  // the cp rank's row of local row 0
  for (int i = 0; i < N; i++) {
    const int64_t r = first + i, b = r / Tl, t = r % Tl;
    out[size_t(i)] = b * T + (P > 1 ? z.position(int(t)) : t);
  }
  return out;
}

std::vector<double> TokenGroup::sum(const std::vector<double>& mine) const {
  if (size() == 1) return mine;
  // Doubles travel as their bits (4 u16 each): the gather is exact, and the sum is done here.
  const std::vector<double> all = gather(*this, mine, DType::u16, 4);
  std::vector<double> total(mine.size(), 0.0);
  for (int q = 0; q < size(); q++)
    for (size_t i = 0; i < total.size(); i++) total[i] += all[size_t(q) * total.size() + i];
  return total;
}

DispatchPlan plan_over_group(const TokenGroup& g, const int32_t* expert, int N, int K, int E, double factor) {
  const int64_t A = int64_t(N) * K, Ntot = int64_t(g.B) * g.T;
  const std::vector<int32_t> all = gather(g, std::vector<int32_t>(expert, expert + A), DType::i32, 1);
  MT_CHECK(int64_t(all.size()) == Ntot * K, "plan_over_group: %zu choices gathered for %lld tokens of %d", all.size(),
           (long long)Ntot, K);
  // Every rank's choices in the micro-batch's token order: the single-rank run's routing array.
  std::vector<int32_t> whole(static_cast<size_t>(Ntot * K));
  for (int c = 0; c < g.cp_size(); c++)
    for (int j = 0; j < g.tp_size(); j++) {
      const std::vector<int64_t> at = g.token_index(j, c, N);
      const int32_t* from = &all[size_t(c * g.tp_size() + j) * size_t(A)];
      for (int i = 0; i < N; i++)
        for (int k = 0; k < K; k++) whole[size_t(at[size_t(i)] * K + k)] = from[int64_t(i) * K + k];
    }
  const int64_t cap = expert_capacity(factor, int(Ntot), K, E);
  const DispatchPlan p = plan_dispatch(whole.data(), int(Ntot), K, E, cap);
  // This rank's assignments keep what the whole plan kept.
  const std::vector<int64_t> mine =
      g.token_index(g.tp_size() > 1 ? g.tp->rank() : 0, g.cp_size() > 1 ? g.cp->rank() : 0, N);
  std::vector<uint8_t> keep(static_cast<size_t>(A));
  for (int i = 0; i < N; i++)
    for (int k = 0; k < K; k++) keep[size_t(int64_t(i) * K + k)] = p.row_of[size_t(mine[size_t(i)] * K + k)] >= 0;
  return plan_kept(expert, keep.data(), N, K, E, cap);
}

}  // namespace mt::moe
