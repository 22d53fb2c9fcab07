// Paired exchanges (parallel/pipeline_exchange.h): gpipe, 1f1b and zb1 run to the end on the whole
// schedule grid when sends wait for their receives (NCCL) and each rank pairs the messages between two
// compute actions into one exchange; a schedule where two ranks each send before they receive (some
// interleaved ones among them) is caught, naming both.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/pipeline_exchange.h"
#include "parallel/pipeline_sim.h"
#include "runtime/check.h"

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
// gpipe, 1f1b and zb1 finish everywhere. Interleaved does not always: its rounds make two ranks each
// send a gradient the other receives only after its own send (p = 2, m = 4, v = 2 is the smallest),
// which eager sends survive and rendezvous sends do not; the trainer refuses those on GPUs.
TEST(PipelineExchange, EveryScheduleButSomeInterleavedRunsUnderRendezvousSends) {
  int checked = 0, interleaved_ok = 0, interleaved_bad = 0;
  for (ScheduleKind k : kKinds)
    for (int p = 1; p <= 8; p++)
      for (int m = 1; m <= 32; m++)
        for (int v = 1; v <= 4; v++) {
          if ((k == ScheduleKind::interleaved) != (v > 1) || (k == ScheduleKind::interleaved && m % p != 0)) continue;
          const Schedule s = build_schedule({k, p, m, v});
          validate_schedule(s);
          const std::string why = rejection(s);
          if (k == ScheduleKind::interleaved) {
            (why.empty() ? interleaved_ok : interleaved_bad)++;
            continue;
          }
          ASSERT_EQ(why, "") << schedule_kind_name(k) << " p=" << p << " m=" << m << " v=" << v;
          checked++;
        }
  EXPECT_EQ(checked, 3 * 8 * 32);
  EXPECT_GT(interleaved_ok, 0) << "p = 1 has no messages at all";
  EXPECT_GT(interleaved_bad, 0);
  const std::string why = rejection(build_schedule({ScheduleKind::interleaved, 2, 4, 2}));
  EXPECT_NE(why.find("pipeline schedule interleaved (p=2, m=4, v=2) under rendezvous sends: deadlock; rank 0 waits"),
            std::string::npos)
      << why;
}

// 1f1b, p = 2, m = 2, rank 0: F0 | send a0, F1 | send a1 + recv g0, B0 | recv g1, B1: the steady
// state's output and input travel in one exchange.
TEST(PipelineExchange, PairsTheMessagesBetweenTwoComputeActions) {
  const Schedule s = build_schedule({ScheduleKind::one_f_one_b, 2, 2, 1});
  const std::vector<Action>& l = s.ranks[0];
  const std::vector<Exchange> ex = paired_exchanges(l, 0);
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
  const std::vector<Exchange> lx = paired_exchanges(last, 1);
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
  const std::vector<Action> l = {F(0, 0), msg(ActionKind::send_activation, 0, 1),
                                 msg(ActionKind::send_activation, 1, 1), F(0, 1)};
  try {
    paired_exchanges(l, 3);
    FAIL() << "accepted";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("rank 3, action 2"), std::string::npos) << w;
    EXPECT_NE(w.find("a second send"), std::string::npos) << w;
  }
}

}  // namespace
}  // namespace mt::parallel
