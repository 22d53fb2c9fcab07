#include "parallel/pipeline_exchange.h"

#include <map>
#include <string>
#include <tuple>

#include "runtime/check.h"

namespace mt::parallel {

namespace {
bool is_send(ActionKind k) { return k == ActionKind::send_activation || k == ActionKind::send_gradient; }
}  // namespace

std::vector<Exchange> paired_exchanges(const std::vector<Action>& list, int rank) {
  std::vector<Exchange> out;
  Exchange cur;
  for (size_t i = 0; i <= list.size(); i++) {
    if (i == list.size() || is_compute(list[i].kind)) {
      cur.before = i;
      if (cur.send >= 0 || cur.recv >= 0) out.push_back(cur);
      cur = Exchange();
      continue;
    }
    long& slot = is_send(list[i].kind) ? cur.send : cur.recv;
    if (slot >= 0)
      fail("pipeline schedule: rank %d, action %zu, %s: a second %s between two compute actions (a paired exchange "
           "holds one send and one receive)",
           rank, i, describe(list[i]).c_str(), is_send(list[i].kind) ? "send" : "receive");
    slot = long(i);
  }
  return out;
}

void check_exchanges(const Schedule& s) {
  const int p = s.p();
  std::vector<std::vector<Exchange>> ex(static_cast<size_t>(p));
  for (int r = 0; r < p; r++) ex[size_t(r)] = paired_exchanges(s.ranks[size_t(r)], r);
  // The other end of each message: (rank, exchange) of the k-th send a -> b and the k-th receive on b
  // from a, keyed by (a, b, k).
  using Key = std::tuple<int, int, int>;
  struct Ends {
    int send_rank = -1, send_ex = -1, recv_rank = -1, recv_ex = -1;
  };
  std::map<Key, Ends> ends;
  std::map<std::pair<int, int>, int> sends, recvs;  // (a, b) -> messages so far
  for (int r = 0; r < p; r++)
    for (size_t e = 0; e < ex[size_t(r)].size(); e++) {
      const Exchange& x = ex[size_t(r)][e];
      const std::vector<Action>& list = s.ranks[size_t(r)];
      if (x.send >= 0) {
        const int b = list[size_t(x.send)].peer;
        Ends& m = ends[{r, b, sends[{r, b}]++}];
        m.send_rank = r;
        m.send_ex = int(e);
      }
      if (x.recv >= 0) {
        const int a = list[size_t(x.recv)].peer;
        Ends& m = ends[{a, r, recvs[{a, r}]++}];
        m.recv_rank = r;
        m.recv_ex = int(e);
      }
    }
  for (const auto& [key, m] : ends)
    MT_CHECK(m.send_rank >= 0 && m.recv_rank >= 0,
             "pipeline schedule: message %d from rank %d to rank %d has no %s (validate the schedule first)",
             std::get<2>(key), std::get<0>(key), std::get<1>(key), m.send_rank < 0 ? "send" : "receive");
  // Each exchange's messages: the key of its send and of its receive, and which of them are done.
  struct State {
    Key send{}, recv{};
    bool send_done = true, recv_done = true;
  };
  std::vector<std::vector<State>> st(static_cast<size_t>(p));
  sends.clear();
  recvs.clear();
  for (int r = 0; r < p; r++)
    for (const Exchange& x : ex[size_t(r)]) {
      State z;
      const std::vector<Action>& list = s.ranks[size_t(r)];
      if (x.send >= 0) {
        const int b = list[size_t(x.send)].peer;
        z.send = {r, b, sends[{r, b}]++};
        z.send_done = false;
      }
      if (x.recv >= 0) {
        const int a = list[size_t(x.recv)].peer;
        z.recv = {a, r, recvs[{a, r}]++};
        z.recv_done = false;
      }
      st[size_t(r)].push_back(z);
    }
  std::vector<size_t> pos(static_cast<size_t>(p), 0);
  auto at = [&](int r, int e) { return pos[size_t(r)] == size_t(e); };
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; r++) {
      if (pos[size_t(r)] == st[size_t(r)].size()) continue;
      State& z = st[size_t(r)][pos[size_t(r)]];
      if (!z.send_done) {
        const Ends& m = ends.at(z.send);
        if (at(m.recv_rank, m.recv_ex)) {
          z.send_done = st[size_t(m.recv_rank)][size_t(m.recv_ex)].recv_done = true;
          moved = true;
        }
      }
      if (!z.recv_done) {
        const Ends& m = ends.at(z.recv);
        if (at(m.send_rank, m.send_ex)) {
          z.recv_done = st[size_t(m.send_rank)][size_t(m.send_ex)].send_done = true;
          moved = true;
        }
      }
      if (z.send_done && z.recv_done) {
        pos[size_t(r)]++;
        moved = true;
      }
    }
  }
  std::string waiting;
  for (int r = 0; r < p; r++) {
    if (pos[size_t(r)] == st[size_t(r)].size()) continue;
    const Exchange& x = ex[size_t(r)][pos[size_t(r)]];
    const State& z = st[size_t(r)][pos[size_t(r)]];
    const std::vector<Action>& list = s.ranks[size_t(r)];
    waiting += strfmt("%srank %d waits in exchange %zu on", waiting.empty() ? "" : "; ", r, pos[size_t(r)]);
    if (!z.send_done) waiting += " " + describe(list[size_t(x.send)]);
    if (!z.recv_done) waiting += std::string(z.send_done ? " " : " and ") + describe(list[size_t(x.recv)]);
  }
  if (!waiting.empty())
    fail("pipeline schedule %s (p=%d, m=%d, v=%d) under rendezvous sends: deadlock; %s",
         schedule_kind_name(s.spec.kind), p, s.m(), s.v(), waiting.c_str());
}

}  // namespace mt::parallel
