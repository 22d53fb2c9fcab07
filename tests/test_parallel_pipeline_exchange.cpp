// Paired exchanges (parallel/pipeline_exchange.h): every schedule of the grid (gpipe, 1f1b, zb1,
// interleaved) runs to the end when sends wait for their receives (NCCL): gpipe, 1f1b and zb1 with the
// messages between two compute actions paired into one exchange, interleaved with the exchange points
// between a backward and the forward after it merged and split by direction. A schedule where two ranks
// each send before they receive is caught, naming both, and so are the interleaved schedules paired as
// the others are. And the executor, in paired mode, issues exactly those exchanges, one call each,
// each before its compute action: the order the check proved.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "parallel/pipeline_exchange.h"
#include "parallel/pipeline_executor.h"
#include "parallel/pipeline_sim.h"
#include "runtime/check.h"
#include "runtime/memory.h"

namespace mt::parallel {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                   ScheduleKind::zb1};

Action F(int chunk, int micro) { return {ActionKind::forward, chunk, micro, -1}; }
Action B(int chunk, int micro) { return {ActionKind::backward, chunk, micro, -1}; }
Action msg(ActionKind k, int micro, int peer) { return {k, 0, micro, peer}; }

std::string rejection(const Schedule& s) {
  try {
    check_exchanges(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The grid of the schedule tests: p 1-8, m 1-32, v 2-4 for interleaved (m % p == 0), v 1 otherwise.
// Every schedule finishes.
TEST(PipelineExchange, EveryScheduleOfTheGridRunsUnderRendezvousSends) {
  int checked = 0;
  for (ScheduleKind k : kKinds)
    for (int p = 1; p <= 8; p++)
      for (int m = 1; m <= 32; m++)
        for (int v = 1; v <= 4; v++) {
          if ((k == ScheduleKind::interleaved) != (v > 1) || (k == ScheduleKind::interleaved && m % p != 0)) continue;
          const Schedule s = build_schedule({k, p, m, v});
          validate_schedule(s);
          ASSERT_EQ(rejection(s), "") << schedule_kind_name(k) << " p=" << p << " m=" << m << " v=" << v;
          checked++;
        }
  EXPECT_EQ(checked, 3 * 8 * 32 + 255);
}

// Why interleaved merges its exchange points: its lists exchanged as 1f1b's are (a point before every
// compute action, one send and one receive each) deadlock in 138 of the grid's 255 cases, the smallest
// p = 2, m = 4, v = 2, where both ranks wait to send a gradient.
TEST(PipelineExchange, InterleavedPairedPerComputeActionDeadlocks) {
  int bad = 0;
  for (int p = 1; p <= 8; p++)
    for (int m = p; m <= 32; m += p)
      for (int v = 2; v <= 4; v++) {
        Schedule s = build_schedule({ScheduleKind::interleaved, p, m, v});
        s.spec.kind = ScheduleKind::one_f_one_b;  // the same lists, paired per compute action
        bad += !rejection(s).empty();
      }
  EXPECT_EQ(bad, 138);
  Schedule s = build_schedule({ScheduleKind::interleaved, 2, 4, 2});
  s.spec.kind = ScheduleKind::one_f_one_b;
  const std::string why = rejection(s);
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  for (const char* part : {"pipeline schedule 1f1b (p=2, m=4, v=2) under rendezvous sends: deadlock; rank 0 waits",
                           "rank 1 waits in exchange 4 on send_gradient(chunk 1, micro 1) to rank 0"})
    EXPECT_NE(why.find(part), std::string::npos) << "'" << part << "' not in: " << why;
}

// Interleaved, p = 2, m = 4, v = 2, rank 0: ... B(1,0) | send g(1,0), F(0,3) | send a(0,3), B(1,1) ...
// has one exchange point before B(1,1) holding two sends and two receives: the gradients (B(1,0)'s out,
// B(1,1)'s in) go first, then the activations (F(0,3)'s out, F(1,2)'s in, received ahead of B(1,1)).
TEST(PipelineExchange, InterleavedSplitsAMergedPointByDirectionGradientsFirst) {
  const Schedule s = build_schedule({ScheduleKind::interleaved, 2, 4, 2});
  const std::vector<Action>& l = s.ranks[0];
  const size_t b11 = size_t(std::find(l.begin(), l.end(), B(1, 1)) - l.begin());
  std::vector<Exchange> there;
  for (const Exchange& x : paired_exchanges(s, 0))
    if (x.before == b11) there.push_back(x);
  ASSERT_EQ(there.size(), 2u);
  auto at = [&](long i) { return l[size_t(i)]; };
  EXPECT_EQ(at(there[0].send), (Action{ActionKind::send_gradient, 1, 0, 1}));
  EXPECT_EQ(at(there[0].recv), (Action{ActionKind::recv_gradient, 1, 1, 1}));
  EXPECT_EQ(at(there[1].send), (Action{ActionKind::send_activation, 0, 3, 1}));
  EXPECT_EQ(at(there[1].recv), (Action{ActionKind::recv_activation, 1, 2, 1}));
  // No exchange point between a backward and the forward right after it.
  for (int r = 0; r < 2; r++)
    for (const Exchange& x : paired_exchanges(s, r)) {
      const std::vector<Action>& list = s.ranks[size_t(r)];
      if (x.before == list.size() || list[x.before].kind != ActionKind::forward) continue;
      size_t prev = x.before;
      while (prev > 0 && !is_compute(list[--prev].kind)) {}
      EXPECT_NE(list[prev].kind, ActionKind::backward) << "rank " << r << " exchange before " << x.before;
    }
}

// 1f1b, p = 2, m = 2, rank 0: F0 | send a0, F1 | send a1 + recv g0, B0 | recv g1, B1: the steady
// state's output and input travel in one exchange.
TEST(PipelineExchange, PairsTheMessagesBetweenTwoComputeActions) {
  const Schedule s = build_schedule({ScheduleKind::one_f_one_b, 2, 2, 1});
  const std::vector<Action>& l = s.ranks[0];
  const std::vector<Exchange> ex = paired_exchanges(s, 0);
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(l[ex[0].before], F(0, 1));
  EXPECT_EQ(l[size_t(ex[0].send)], msg(ActionKind::send_activation, 0, 1));
  EXPECT_EQ(ex[0].recv, -1);
  EXPECT_EQ(l[ex[1].before], B(0, 0));
  EXPECT_EQ(l[size_t(ex[1].send)], msg(ActionKind::send_activation, 1, 1));
  EXPECT_EQ(l[size_t(ex[1].recv)], msg(ActionKind::recv_gradient, 0, 1));
  EXPECT_EQ(l[ex[2].before], B(0, 1));
  EXPECT_EQ(ex[2].send, -1);
  EXPECT_EQ(l[size_t(ex[2].recv)], msg(ActionKind::recv_gradient, 1, 1));
  // The last rank's final send comes after its last compute action: an exchange at the list's end.
  const std::vector<Action>& last = s.ranks[1];
  const std::vector<Exchange> lx = paired_exchanges(s, 1);
  EXPECT_EQ(lx.back().before, last.size());
  EXPECT_EQ(last[size_t(lx.back().send)], msg(ActionKind::send_gradient, 1, 0));
}

// Two ranks that each send, compute, then receive what the other sent: fine with eager sends, a
// deadlock when a send waits for its receive. The same messages paired into one exchange are fine.
TEST(PipelineExchange, SendingBeforeReceivingOnBothRanksDeadlocks) {
  Schedule s;
  s.spec = {ScheduleKind::one_f_one_b, 2, 2, 1};
  s.ranks = {{F(0, 0), msg(ActionKind::send_activation, 0, 1), F(0, 1), msg(ActionKind::recv_gradient, 0, 1), B(0, 0)},
             {F(0, 0), msg(ActionKind::send_gradient, 0, 0), F(0, 1), msg(ActionKind::recv_activation, 0, 0), B(0, 0)}};
  const std::string msg_text = rejection(s);
  ASSERT_FALSE(msg_text.empty()) << "accepted";
  EXPECT_EQ(msg_text.find('\n'), std::string::npos) << msg_text;
  for (const char* part : {"under rendezvous sends: deadlock", "rank 0 waits in exchange 0 on send_activation",
                           "rank 1 waits in exchange 0 on send_gradient"})
    EXPECT_NE(msg_text.find(part), std::string::npos) << "'" << part << "' not in: " << msg_text;
  // Paired: each rank's send and receive in one exchange.
  for (auto& l : s.ranks) std::swap(l[2], l[3]);
  EXPECT_EQ(rejection(s), "");
}

TEST(PipelineExchange, TwoSendsBetweenComputeActionsAreRefused) {
  Schedule s;
  s.spec = {ScheduleKind::one_f_one_b, 4, 2, 1};
  s.ranks.resize(4);
  s.ranks[3] = {F(0, 0), msg(ActionKind::send_activation, 0, 1), msg(ActionKind::send_activation, 1, 1), F(0, 1)};
  try {
    paired_exchanges(s, 3);
    FAIL() << "accepted";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("rank 3, action 2"), std::string::npos) << w;
    EXPECT_NE(w.find("a second send between two compute actions"), std::string::npos) << w;
  }
  // Interleaved splits a point's messages by direction, but two in one direction stay refused.
  s.spec = {ScheduleKind::interleaved, 4, 4, 2};
  s.ranks[3] = {F(0, 0), msg(ActionKind::send_activation, 0, 1), msg(ActionKind::send_gradient, 0, 2), F(0, 1)};
  EXPECT_EQ(paired_exchanges(s, 3).size(), 2u);  // one send each way: an exchange each
  s.ranks[3].push_back(msg(ActionKind::send_activation, 1, 1));
  s.ranks[3].push_back(msg(ActionKind::recv_gradient, 0, 1));
  s.ranks[3].push_back(msg(ActionKind::recv_gradient, 1, 1));
  s.ranks[3].push_back(B(0, 0));
  try {
    paired_exchanges(s, 3);
    FAIL() << "accepted";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("rank 3, action 6, recv_gradient(chunk 0, micro 1) from rank 1: a second receive in one "
                     "direction"), std::string::npos) << w;
  }
}

// One rank of a pipeline as the executor sees it, with no peers: a Comm that records every
// point-to-point call and completes it at once, and stages that record every compute action.
class RecordingComm final : public Comm {
 public:
  RecordingComm(int rank, int size, std::vector<std::string>& log) : Comm(rank, size, Device::cpu, "pp"), log_(log) {}

 protected:
  CommHandle do_send_recv(const void*, size_t, int dst, void* recv_buf, size_t recv_count, int src, DType t,
                          int) override {
    log_.push_back(strfmt("exchange send %d recv %d", dst, src));
    if (src >= 0) std::fill_n(static_cast<char*>(recv_buf), recv_count * dtype_size(t), 0);
    return {};
  }
  CommHandle do_all_reduce(void*, size_t, DType, ReduceOp) override { return unused(); }
  CommHandle do_reduce_scatter(const void*, void*, size_t, DType, ReduceOp) override { return unused(); }
  CommHandle do_all_gather(const void*, void*, size_t, DType) override { return unused(); }
  CommHandle do_all_to_all_v(const void*, std::span<const size_t>, void*, std::span<const size_t>, DType) override {
    return unused();
  }
  CommHandle do_broadcast(void*, size_t, DType, int) override { return unused(); }
  CommHandle do_barrier() override { return unused(); }
  std::unique_ptr<Comm> do_split(int, int, const std::string&, Arena*) override { unused(); return nullptr; }

 private:
  static CommHandle unused() { fail("the pipeline executor called a collective"); }
  std::vector<std::string>& log_;
};

class RecordingStages final : public PipelineStages {
 public:
  RecordingStages(const Schedule& s, int rank, std::vector<std::string>& log, Arena& arena)
      : s_(s), rank_(rank), log_(log), arena_(arena) {}
  size_t message_elems() const override { return 8; }
  DType message_dtype() const override { return DType::f32; }
  Buffer alloc_message() override { return arena_.alloc(MemCategory::activations, 32); }
  void before(const Action&, bool) override {}
  Buffer forward(int chunk, int micro, Buffer) override {
    log_.push_back(describe(F(chunk, micro)));
    return s_.stage(rank_, chunk) + 1 < s_.stages() ? alloc_message() : Buffer();
  }
  Buffer backward(int chunk, int micro, Buffer) override {
    log_.push_back(describe(B(chunk, micro)));
    return s_.stage(rank_, chunk) > 0 ? alloc_message() : Buffer();
  }
  Buffer backward_input(int chunk, int micro, Buffer) override {
    log_.push_back(describe({ActionKind::backward_input, chunk, micro, -1}));
    return s_.stage(rank_, chunk) > 0 ? alloc_message() : Buffer();
  }
  void backward_weight(int chunk, int micro) override {
    log_.push_back(describe({ActionKind::backward_weight, chunk, micro, -1}));
  }

 private:
  const Schedule& s_;
  int rank_;
  std::vector<std::string>& log_;
  Arena& arena_;
};

TEST(PipelineExchange, ThePairedExecutorIssuesExactlyTheCheckedExchanges) {
  Arena arena(host_memory());
  int runs = 0;
  for (ScheduleKind k : kKinds)
    for (int p = 2; p <= 4; p++)
      for (int m : {1, 2, p + 1, 2 * p}) {
        const bool interleaved = k == ScheduleKind::interleaved;
        if (interleaved && m % p != 0) continue;
        const Schedule s = build_schedule({k, p, m, interleaved ? 1 + m / p : 1});  // v 2 and 3
        for (int r = 0; r < p; r++) {
          const std::vector<Action>& l = s.ranks[size_t(r)];
          std::vector<std::string> want;
          const std::vector<Exchange> ex = paired_exchanges(s, r);
          size_t e = 0;
          for (size_t i = 0; i <= l.size(); i++) {
            for (; e < ex.size() && ex[e].before == i; e++)
              want.push_back(strfmt("exchange send %d recv %d", ex[e].send >= 0 ? l[size_t(ex[e].send)].peer : -1,
                                    ex[e].recv >= 0 ? l[size_t(ex[e].recv)].peer : -1));
            if (i < l.size() && is_compute(l[i].kind)) want.push_back(describe(l[i]));
          }
          std::vector<std::string> got;
          RecordingComm comm(r, p, got);
          RecordingStages stages(s, r, got, arena);
          PipelineExecutor exec(s, comm, Pairing::paired);
          exec.run(stages);
          ASSERT_EQ(got, want) << schedule_kind_name(k) << " p=" << p << " m=" << m << " rank " << r;
          runs++;
        }
      }
  EXPECT_EQ(runs, 3 * (2 + 3 + 4) * 4 + 2 * 2 + 3 + 4);  // interleaved: m = 2p, and m = p for p = 2
}

}  // namespace
}  // namespace mt::parallel
