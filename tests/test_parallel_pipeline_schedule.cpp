// Pipeline schedules on a grid of (p ranks, m micro-batches, v chunks), checked by the simulator and
// against the papers' formulas: bubble, activation peaks, where the sends and receives sit, and the
// text grid. No MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_sim.h"
#include "runtime/check.h"

namespace mt::parallel {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                   ScheduleKind::zb1};

// Every spec of the grid: p 1-8, m 1-32 (odd p, m < p and m not divisible by p included), v 2-4 for
// interleaved (which needs m % p == 0), v 1 otherwise.
std::vector<ScheduleSpec> grid() {
  std::vector<ScheduleSpec> out;
  for (ScheduleKind k : kKinds)
    for (int p = 1; p <= 8; p++)
      for (int m = 1; m <= 32; m++) {
        if (k != ScheduleKind::interleaved) {
          out.push_back({k, p, m, 1});
          continue;
        }
        if (m % p != 0) continue;
        for (int v = 2; v <= 4; v++) out.push_back({k, p, m, v});
      }
  return out;
}

std::string name(const ScheduleSpec& s) {
  return std::string(schedule_kind_name(s.kind)) + " p=" + std::to_string(s.p) + " m=" + std::to_string(s.m) +
         " v=" + std::to_string(s.v);
}

// Relative closeness for quantities that are exact in exact arithmetic (sums of a few costs).
void expect_close(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, 1e-9 * std::max(1.0, std::abs(want))) << what;
}

// Cost triples (T_F, T_B, T_W): equal, backward twice the forward, and a light W.
const PipelineCosts kCosts[] = {{1, 1, 1, 0}, {1, 1.5, 0.5, 0}, {2, 1, 1, 0}, {1, 2, 0.75, 0}};

TEST(PipelineSchedule, NamesParseAndUnknownNamesAreRefusedNamingTheOption) {
  for (ScheduleKind k : kKinds) EXPECT_EQ(parse_schedule_kind(schedule_kind_name(k)), k);
  try {
    parse_schedule_kind("2f2b");
    FAIL() << "2f2b accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "pp.schedule: unknown schedule '2f2b' (expected gpipe, 1f1b, interleaved or zb1)");
  }
}

TEST(PipelineSchedule, SpecsThatCannotBeBuiltAreRefusedNamingTheOption) {
  const std::pair<ScheduleSpec, std::string> bad[] = {
      {{ScheduleKind::one_f_one_b, 0, 4, 1}, "pp must be at least 1"},
      {{ScheduleKind::gpipe, 2, 0, 1}, "grad_accum (micro-batches per step) must be at least 1"},
      {{ScheduleKind::interleaved, 2, 4, 0}, "pp.virtual (model chunks per rank) must be at least 1"},
      {{ScheduleKind::interleaved, 2, 4, 1}, "pp.schedule=interleaved needs pp.virtual >= 2"},
      {{ScheduleKind::interleaved, 4, 6, 2}, "needs grad_accum (6 micro-batches) to be a multiple of pp (4)"},
      {{ScheduleKind::interleaved, 4, 2, 2}, "needs grad_accum (2 micro-batches) to be a multiple of pp (4)"},
      {{ScheduleKind::zb1, 4, 8, 2}, "pp.virtual=2 needs pp.schedule=interleaved"},
      {{ScheduleKind::one_f_one_b, 512, 513, 1}, "forward passes per step is more than a schedule holds"},
  };
  for (const auto& [spec, msg] : bad) {
    try {
      build_schedule(spec);
      ADD_FAILURE() << name(spec) << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
    }
  }
}

// Counts each (kind, stage, micro) directly from the lists, apart from the validator.
TEST(PipelineSchedule, EveryStageRunsEachPassOfEveryMicroBatchOnce) {
  for (const ScheduleSpec& spec : grid()) {
    const Schedule s = build_schedule(spec);
    std::map<std::tuple<ActionKind, int, int>, int> count;
    for (int r = 0; r < spec.p; r++)
      for (const Action& a : s.ranks[size_t(r)])
        if (is_compute(a.kind)) count[{a.kind, s.stage(r, a.chunk), a.micro}]++;
    const std::vector<ActionKind> kinds = s.split_backward()
        ? std::vector<ActionKind>{ActionKind::forward, ActionKind::backward_input, ActionKind::backward_weight}
        : std::vector<ActionKind>{ActionKind::forward, ActionKind::backward};
    ASSERT_EQ(count.size(), kinds.size() * size_t(s.stages()) * size_t(spec.m)) << name(spec);
    for (const auto& [key, n] : count) ASSERT_EQ(n, 1) << name(spec);
    for (const auto& [key, n] : count) ASSERT_NE(std::find(kinds.begin(), kinds.end(), std::get<0>(key)), kinds.end());
  }
}

TEST(PipelineSchedule, EveryScheduleOfTheGridValidates) {
  for (const ScheduleSpec& spec : grid()) {
    try {
      validate_schedule(build_schedule(spec));
    } catch (const Error& e) {
      ADD_FAILURE() << name(spec) << ": " << e.what();
    }
  }
}

// GPipe and 1F1B: (p-1)/(m+p-1) of the step (Huang et al. 2019; Narayanan et al. 2021), for any
// per-micro-batch costs as long as every stage costs the same.
TEST(PipelineSchedule, GpipeAndOneFOneBBubbleIsPMinusOneOverMPlusPMinusOne) {
  for (const ScheduleSpec& spec : grid()) {
    if (spec.kind != ScheduleKind::gpipe && spec.kind != ScheduleKind::one_f_one_b) continue;
    const Schedule s = build_schedule(spec);
    for (const PipelineCosts& c : kCosts) {
      const Simulation sim = simulate(s, c);
      const int p = spec.p, m = spec.m;
      expect_close(sim.bubble_fraction(), double(p - 1) / (m + p - 1), name(spec));
      expect_close(sim.ideal(), m * (c.forward + c.backward_input + c.backward_weight), name(spec));
      expect_close(sim.bubble_time(), formula_bubble_time(spec, c), name(spec));
    }
  }
}

// Interleaved: (p-1)/(v m) of the ideal time (Narayanan et al. 2021, sec. 2.2.1).
TEST(PipelineSchedule, InterleavedBubbleIsPMinusOneOverVMOfTheIdealTime) {
  for (const ScheduleSpec& spec : grid()) {
    if (spec.kind != ScheduleKind::interleaved) continue;
    const Schedule s = build_schedule(spec);
    for (const PipelineCosts& c : kCosts) {
      const Simulation sim = simulate(s, c);
      expect_close(sim.bubble_over_ideal(), double(spec.p - 1) / (spec.v * spec.m), name(spec));
      expect_close(sim.bubble_time(), formula_bubble_time(spec, c), name(spec));
    }
  }
}

// ZB-H1 (Qi et al. 2023): bubble (p-1)(T_F + T_B - T_W) for m >= p and T_W <= T_F, T_B; with equal
// costs exactly a third of 1F1B's (p-1)(T_F + T_B + T_W). Tolerance: 1e-9 relative (sums of costs).
TEST(PipelineSchedule, ZeroBubbleH1BubbleIsAThirdOfOneFOneBsWithEqualCosts) {
  for (const ScheduleSpec& spec : grid()) {
    if (spec.kind != ScheduleKind::zb1) continue;
    const Schedule zb = build_schedule(spec);
    const Schedule ofob = build_schedule({ScheduleKind::one_f_one_b, spec.p, spec.m, 1});
    const double zb_bubble = simulate(zb).bubble_time(), ofob_bubble = simulate(ofob).bubble_time();
    if (spec.m >= spec.p) {
      expect_close(zb_bubble, ofob_bubble / 3, name(spec));
      for (const PipelineCosts& c : kCosts) {
        if (c.backward_weight > std::min(c.forward, c.backward_input)) continue;
        expect_close(simulate(zb, c).bubble_time(),
                     (spec.p - 1) * (c.forward + c.backward_input - c.backward_weight), name(spec));
        expect_close(simulate(zb, c).bubble_time(), formula_bubble_time(spec, c), name(spec));
      }
      // Outside the paper's regime (a W dearer than F or B) this schedule's bubble is
      // (p-1) max(T_F + T_B - T_W, T_F, T_B): never worse than the slower of the two passes.
      for (const PipelineCosts& c : {PipelineCosts{1, 1, 2, 0}, PipelineCosts{1, 2, 2, 0}, PipelineCosts{1, 3, 1.5, 0}}) {
        const double want = (spec.p - 1) * std::max({c.forward + c.backward_input - c.backward_weight, c.forward, c.backward_input});
        expect_close(simulate(zb, c).bubble_time(), want, name(spec));
      }
    } else if (spec.p > 1) {
      EXPECT_LT(zb_bubble, ofob_bubble) << name(spec);  // fewer micro-batches than ranks: no formula
      EXPECT_TRUE(std::isnan(formula_bubble_time(spec, PipelineCosts())));
    }
  }
}

// Activations in flight (held from F until B, or W): GPipe holds all m; 1F1B at most p (min(p-r, m)
// on rank r); ZB-H1 the same peak as 1F1B; interleaved its warmup plus one, in chunk micro-batches.
TEST(PipelineSchedule, PeakActivationsMatchEachSchedulesPromise) {
  for (const ScheduleSpec& spec : grid()) {
    const Simulation sim = simulate(build_schedule(spec));
    const int p = spec.p, m = spec.m, v = spec.v;
    const int ofob_peak = std::min(p, m);
    for (int r = 0; r < p; r++) {
      const int got = sim.peak_pairs[size_t(r)];
      switch (spec.kind) {
        case ScheduleKind::gpipe: EXPECT_EQ(got, m) << name(spec) << " rank " << r; break;
        case ScheduleKind::one_f_one_b:
          EXPECT_EQ(got, std::min(p - r, m)) << name(spec) << " rank " << r;
          EXPECT_LE(sim.peak_activations(r), p);
          break;
        case ScheduleKind::zb1: EXPECT_LE(got, ofob_peak) << name(spec) << " rank " << r; break;
        case ScheduleKind::interleaved:
          EXPECT_EQ(got, std::min((p - r - 1) * 2 + (v - 1) * p + 1, m * v)) << name(spec) << " rank " << r;
          EXPECT_DOUBLE_EQ(sim.peak_activations(r), double(got) / v);
          break;
      }
    }
    if (spec.kind == ScheduleKind::zb1) {
      EXPECT_EQ(*std::max_element(sim.peak_pairs.begin(), sim.peak_pairs.end()), ofob_peak) << name(spec);
    }
  }
}

// The header's promise to an executor: each receive right before its consumer, each send right
// after its producer, none with p = 1, and (S-1) m messages each way per step.
TEST(PipelineSchedule, SendsFollowTheirProducerAndReceivesPrecedeTheirConsumer) {
  for (const ScheduleSpec& spec : grid()) {
    const Schedule s = build_schedule(spec);
    const ActionKind bwd = s.split_backward() ? ActionKind::backward_input : ActionKind::backward;
    int sends_act = 0, sends_grad = 0;
    for (int r = 0; r < spec.p; r++) {
      const std::vector<Action>& l = s.ranks[size_t(r)];
      for (size_t k = 0; k < l.size(); k++) {
        const Action& a = l[k];
        if (is_compute(a.kind)) continue;
        ASSERT_GT(spec.p, 1) << name(spec);
        const bool recv = a.kind == ActionKind::recv_activation || a.kind == ActionKind::recv_gradient;
        const bool act = a.kind == ActionKind::recv_activation || a.kind == ActionKind::send_activation;
        const Action want{act ? ActionKind::forward : bwd, a.chunk, a.micro, -1};
        const size_t j = recv ? k + 1 : k - 1;
        ASSERT_LT(j, l.size()) << name(spec);
        EXPECT_EQ(l[j], want) << name(spec) << " rank " << r << " action " << k;
        if (a.kind == ActionKind::send_activation) sends_act++;
        if (a.kind == ActionKind::send_gradient) sends_grad++;
      }
    }
    const int boundaries = spec.p > 1 ? s.stages() - 1 : 0;
    EXPECT_EQ(sends_act, boundaries * spec.m) << name(spec);
    EXPECT_EQ(sends_grad, boundaries * spec.m) << name(spec);
  }
}

// Grids worked out by hand from the schedules' definitions (unit costs: a full B takes two slots).
TEST(PipelineSchedule, GridShowsEachRanksActionsInTime) {
  const PipelineCosts unit;
  const Schedule gpipe = build_schedule({ScheduleKind::gpipe, 2, 2, 1});
  EXPECT_EQ(render_grid(gpipe, simulate(gpipe, unit), 1.0),
            "   t r0 r1\n"
            "   0 F0 .\n"
            "   1 F1 F0\n"
            "   2 .  F1\n"
            "   3 .  B0\n"
            "   4 .  B0\n"
            "   5 B0 B1\n"
            "   6 B0 B1\n"
            "   7 B1 .\n"
            "   8 B1 .\n");
  // ZB-H1 on 2 ranks: rank 1 defers W0 past B1, and the Ws fill what would be 1f1b's cooldown bubble.
  const Schedule zb = build_schedule({ScheduleKind::zb1, 2, 3, 1});
  EXPECT_EQ(render_grid(zb, simulate(zb, unit), 1.0),
            "   t r0 r1\n"
            "   0 F0 .\n"
            "   1 F1 F0\n"
            "   2 .  B0\n"
            "   3 B0 F1\n"
            "   4 W0 B1\n"
            "   5 F2 W0\n"
            "   6 B1 F2\n"
            "   7 W1 B2\n"
            "   8 B2 W1\n"
            "   9 W2 W2\n");
  // Interleaved: chunk first; a chunk's pass costs 1/v, one slot of 1/2.
  const Schedule il = build_schedule({ScheduleKind::interleaved, 2, 2, 2});
  const std::string want =
      "   t r0  r1\n"
      "   0 0F0 .\n"
      "   1 0F1 0F0\n"
      "   2 1F0 0F1\n"
      "   3 1F1 1F0\n";
  EXPECT_EQ(render_grid(il, simulate(il, unit), 0.5).substr(0, want.size()), want);
}

}  // namespace
}  // namespace mt::parallel
