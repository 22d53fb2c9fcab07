#include "moe/ep_exchange.h"

#include <cstring>

#include "runtime/check.h"
#include "runtime/storage.h"

namespace mt::moe {

namespace {
// Per (source s, local expert e): where its rows start in the source-major receive buffer and in the
// expert-major layout the experts read.
struct Offsets {
  std::vector<int64_t> by_source, by_expert;  // (ranks x local), at s local + e
};

Offsets offsets(const ExpertExchange& x) {
  Offsets o;
  o.by_source.resize(x.count.size());
  o.by_expert.resize(x.count.size());
  int64_t r = 0;
  for (int s = 0; s < x.ranks; s++)
    for (int e = 0; e < x.local; e++) {
      o.by_source[size_t(s * x.local + e)] = r;
      r += x.count[size_t(s * x.local + e)];
    }
  for (int e = 0; e < x.local; e++) {
    int64_t at = x.experts.offset[size_t(e)];
    for (int s = 0; s < x.ranks; s++) {
      o.by_expert[size_t(s * x.local + e)] = at;
      at += x.count[size_t(s * x.local + e)];
    }
  }
  return o;
}

std::vector<size_t> elements(const std::vector<size_t>& rows, int C) {
  std::vector<size_t> out;
  for (size_t r : rows) out.push_back(r * size_t(C));
  return out;
}
}  // namespace

ExpertExchange exchange_counts(const DispatchPlan& p, parallel::Comm& ep) {
  ExpertExchange x;
  x.ranks = ep.size();
  x.rank = ep.rank();
  MT_CHECK(p.E % x.ranks == 0, "expert parallelism: %d experts do not split over %d ranks", p.E, x.ranks);
  x.local = p.E / x.ranks;
  std::vector<int32_t> send(size_t(p.E)), recv(size_t(p.E));
  for (int e = 0; e < p.E; e++) send[size_t(e)] = int32_t(p.rows_of(e));
  const std::vector<size_t> per_rank(size_t(x.ranks), size_t(x.local));
  ep.all_to_all_v(send.data(), per_rank, recv.data(), per_rank, DType::i32);
  x.count.assign(recv.begin(), recv.end());
  for (int j = 0; j < x.ranks; j++) {
    x.send_rows.push_back(size_t(p.offset[size_t((j + 1) * x.local)] - p.offset[size_t(j * x.local)]));
    size_t r = 0;
    for (int e = 0; e < x.local; e++) r += size_t(x.count[size_t(j * x.local + e)]);
    x.recv_rows.push_back(r);
  }
  x.experts.E = x.local;
  x.experts.offset.assign(size_t(x.local) + 1, 0);
  for (int e = 0; e < x.local; e++) {
    int64_t n = 0;
    for (int s = 0; s < x.ranks; s++) n += x.count[size_t(s * x.local + e)];
    x.experts.offset[size_t(e) + 1] = x.experts.offset[size_t(e)] + n;
  }
  return x;
}

template <class S>
void to_experts(S* out, const S* rows, const ExpertExchange& x, int C, parallel::Comm& data, S* staging,
                const MemOps& mem) {
  data.all_to_all_v(rows, elements(x.send_rows, C), staging, elements(x.recv_rows, C), dtype_of<S>());
  const Offsets o = offsets(x);
  for (size_t i = 0; i < x.count.size(); i++)
    if (x.count[i] > 0) mem.move(out + o.by_expert[i] * C, staging + o.by_source[i] * C, size_t(x.count[i]) * C * sizeof(S));
}

template <class S>
void from_experts(S* rows, const S* expert_rows, const ExpertExchange& x, int C, parallel::Comm& data, S* staging,
                  const MemOps& mem) {
  const Offsets o = offsets(x);
  for (size_t i = 0; i < x.count.size(); i++)
    if (x.count[i] > 0)
      mem.move(staging + o.by_source[i] * C, expert_rows + o.by_expert[i] * C, size_t(x.count[i]) * C * sizeof(S));
  data.all_to_all_v(staging, elements(x.recv_rows, C), rows, elements(x.send_rows, C), dtype_of<S>());
}

#define MT_EP_EXCHANGE(S)                                                                              \
  template void to_experts<S>(S*, const S*, const ExpertExchange&, int, parallel::Comm&, S*, const MemOps&); \
  template void from_experts<S>(S*, const S*, const ExpertExchange&, int, parallel::Comm&, S*, const MemOps&);
MT_EP_EXCHANGE(float)
MT_EP_EXCHANGE(bf16)
MT_EP_EXCHANGE(f16)
#undef MT_EP_EXCHANGE

}  // namespace mt::moe
