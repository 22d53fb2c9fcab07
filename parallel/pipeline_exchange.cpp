#include "parallel/pipeline_exchange.h"

#include <map>
#include <string>
#include <tuple>

#include "runtime/check.h"

namespace mt::parallel {

namespace {
bool is_send(ActionKind k) { return k == ActionKind::send_activation || k == ActionKind::send_gradient; }
bool is_gradient(ActionKind k) { return k == ActionKind::send_gradient || k == ActionKind::recv_gradient; }
bool is_backward(ActionKind k) { return k == ActionKind::backward || k == ActionKind::backward_input; }

// The messages one exchange point holds (indices into the list, in list order) as exchanges of at
// most one send and one receive: one exchange when that is all there is; otherwise, where points are
// merged, one per direction, the gradients first.
void split_point(const std::vector<Action>& list, int rank, size_t before, const std::vector<long>& msgs,
                 bool merged, std::vector<Exchange>& out) {
  int sends = 0;
  for (long i : msgs) sends += is_send(list[size_t(i)].kind);
  const bool split = merged && (sends > 1 || msgs.size() - size_t(sends) > 1);
  for (int pass = 0; pass < (split ? 2 : 1); pass++) {
    Exchange x;
    x.before = before;
    for (long i : msgs) {
      const Action& a = list[size_t(i)];
      if (split && is_gradient(a.kind) != (pass == 0)) continue;
      long& slot = is_send(a.kind) ? x.send : x.recv;
      if (slot >= 0)
        fail("pipeline schedule: rank %d, action %ld, %s: a second %s %s (an exchange holds one send and one "
             "receive%s)",
             rank, i, describe(a).c_str(), is_send(a.kind) ? "send" : "receive",
             merged ? "in one direction at one exchange point" : "between two compute actions",
             merged ? " per direction" : "");
      slot = i;
    }
    if (x.send >= 0 || x.recv >= 0) out.push_back(x);
  }
}
}  // namespace

std::vector<Exchange> paired_exchanges(const Schedule& s, int rank) {
  const std::vector<Action>& list = s.ranks[size_t(rank)];
  const bool merged = s.spec.kind == ScheduleKind::interleaved;
  // The exchange points (list indices of the compute actions they precede, then the list's end), and
  // for each compute action the last point at or before it.
  std::vector<size_t> points;
  std::vector<size_t> point_of(list.size(), 0);
  long prev = -1;  // the previous compute action
  for (size_t i = 0; i < list.size(); i++) {
    if (!is_compute(list[i].kind)) continue;
    const bool joined =
        merged && prev >= 0 && list[i].kind == ActionKind::forward && is_backward(list[size_t(prev)].kind);
    if (!joined) points.push_back(i);
    point_of[i] = points.size() - 1;
    prev = long(i);
  }
  points.push_back(list.size());
  // Each message at its point: a receive at its consumer's, a send at the one after its producer's.
  std::vector<std::vector<long>> at(points.size());
  prev = -1;
  for (size_t i = 0; i < list.size(); i++) {
    if (is_compute(list[i].kind)) {
      prev = long(i);
      continue;
    }
    if (is_send(list[i].kind)) {
      MT_CHECK(prev >= 0, "pipeline schedule: rank %d, action %zu, %s: no compute action before it", rank, i,
               describe(list[i]).c_str());
      at[point_of[size_t(prev)] + 1].push_back(long(i));
      continue;
    }
    size_t consumer = i + 1;
    while (consumer < list.size() && !is_compute(list[consumer].kind)) consumer++;
    MT_CHECK(consumer < list.size(), "pipeline schedule: rank %d, action %zu, %s: no compute action after it", rank,
             i, describe(list[i]).c_str());
    at[point_of[consumer]].push_back(long(i));
  }
  std::vector<Exchange> out;
  for (size_t k = 0; k < points.size(); k++) split_point(list, rank, points[k], at[k], merged, out);
  return out;
}

void check_exchanges(const Schedule& s) {
  const int p = s.p();
  std::vector<std::vector<Exchange>> ex(static_cast<size_t>(p));
  for (int r = 0; r < p; r++) ex[size_t(r)] = paired_exchanges(s, r);
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
