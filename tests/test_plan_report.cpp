// `minitrain plan`'s pipeline report (the grid, the simulated bubble next to the formula, the peaks)
// and one line naming the option for each bad input (tests/test_train_plan_model.cpp: the figures).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plan/plan.h"
#include "runtime/check.h"

namespace mt::plan {
namespace {

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in:\n" << text;
}

TEST(Plan, OneFOneBReportShowsTheGridTheBubbleAndThePeaks) {
  const std::string r = plan_report({"pp=4", "grad_accum=8", "pp.schedule=1f1b"});
  expect_contains(r, "pipeline: pp.schedule=1f1b pp=4 grad_accum=8 pp.virtual=1");
  expect_contains(r, "   t r0 r1 r2 r3\n   0 F0 .  .  .\n   1 F1 F0 .  .\n");
  // 3/11 of the step, 3/8 of the ideal time (p = 4, m = 8).
  expect_contains(r, "bubble of the step:  simulated 0.2727  formula (p-1)/(m+p-1) = 0.2727\n");
  expect_contains(r, "bubble / ideal time: simulated 0.3750  formula (p-1)/m = 0.3750\n");
  expect_contains(r, "micro-batches of a rank's layers: r0 4 r1 3 r2 2 r3 1\n");
}

TEST(Plan, InterleavedAndZeroBubbleReportTheirOwnFormulas) {
  const std::string il = plan_report({"pp=2", "grad_accum=4", "pp.schedule=interleaved", "pp.virtual=2"});
  expect_contains(il, "   0 0F0 .\n");  // chunk first in a cell
  expect_contains(il, "bubble / ideal time: simulated 0.1250  formula (p-1)/(v m) = 0.1250\n");
  const std::string zb = plan_report({"--pp", "4", "--grad_accum=8", "pp.schedule=zb1"});
  expect_contains(zb, "B input gradient, W weight gradient");
  expect_contains(zb, "bubble / ideal time: simulated 0.1250  formula (p-1)/(3m) = 0.1250\n");
  expect_contains(plan_report({"pp=4", "grad_accum=2", "pp.schedule=zb1"}), "(no formula with grad_accum < pp)");
}

TEST(Plan, BadInputFailsWithOneLineNamingTheOption) {
  const std::pair<std::vector<std::string>, std::string> bad[] = {
      {{"pp=4", "grad_accum=8", "pp.schedule=2f2b"}, "pp.schedule: unknown schedule '2f2b'"},
      // The trainer's own parser and rules: its messages.
      {{"pp=0", "grad_accum=8"}, "parallel.pp must be positive (got 0)"},
      {{"pp=2", "grad_accum=0"}, "grad_accum must be positive (got 0)"},
      {{"pp=2", "grad_accum=4", "pp.schedule=interleaved", "pp.virtual=0"}, "pp.virtual must be positive (got 0)"},
      {{"pp=2", "grad_accum=4", "pp.schedule=interleaved"}, "pp.schedule=interleaved needs pp.virtual >= 2"},
      {{"pp=4", "grad_accum=6", "pp.schedule=interleaved", "pp.virtual=2", "model.n_layer=8"}, "to be a multiple of pp (4)"},
      {{"pp=4", "grad_accum=8", "pp.virtual=2"}, "pp.virtual=2 needs pp.schedule=interleaved"},
      {{"pp=x"}, "pp must be an integer (got 'x')"},
      {{"pp=2", "zero=7"}, "parallel.zero must be in [0, 3] (got 7)"},
      {{"pp=2", "bogus=1"}, "unknown option 'bogus'"},
      {{"4"}, "unexpected argument '4'"},
      {{"pp=8"}, "--pp 8 is larger than the model's 4 layers"},
      // Plan's own options.
      {{"hw=h999"}, "hw=h999: not a known hardware name (h100, h200, a100, cpu) and no such file"},
      {{"gpus=6", "tp=4"}, "gpus=6 is not divisible by tp 4 x pp 1 x cp 1 = 4"},
      {{"gpus=4", "dp=2"}, "gpus=4 but dp 2 x tp 1 x pp 1 x cp 1 = 2"},
      {{"tokens=-5"}, "tokens must not be negative"},
      {{"--search"}, "gpus must be positive with --search (got 0)"},
  };
  for (const auto& [args, msg] : bad) {
    try {
      plan_report(args);
      ADD_FAILURE() << msg << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace mt::plan
