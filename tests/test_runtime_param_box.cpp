// A parameter's box maps its local elements onto the global tensor: for every split a parallel layout
// makes (rows, columns, the heads of c_attn seen as (3, C, C)), the runs for_each_global_run reports
// cover exactly the elements an independent coordinate walk finds, in local order, for any local range.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "runtime/check.h"
#include "runtime/param_store.h"

namespace mt {
namespace {

// The global flat index of every local element, by walking the box's coordinates one by one.
std::vector<int64_t> global_indices(const ParamBox& b) {
  const size_t nd = b.space.size();
  std::vector<int64_t> out, idx(nd, 0);
  for (int64_t k = 0; k < b.numel(); k++) {
    int64_t g = 0;
    for (size_t d = 0; d < nd; d++) g = g * b.space[d] + b.offset[d] + idx[d];
    out.push_back(g);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < b.extent[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

std::vector<int64_t> via_runs(const ParamEntry& e, int64_t lb, int64_t le) {
  std::vector<int64_t> out;
  int64_t expect_local = lb;
  for_each_global_run(e, lb, le, [&](int64_t gb, int64_t ge, int64_t local) {
    EXPECT_EQ(local, expect_local) << "runs out of local order";
    EXPECT_LT(gb, ge);
    for (int64_t g = gb; g < ge; g++) out.push_back(g);
    expect_local += ge - gb;
  });
  EXPECT_EQ(expect_local, le);
  return out;
}

ParamEntry entry(std::vector<int64_t> space, std::vector<int64_t> offset, std::vector<int64_t> extent) {
  ParamEntry e;
  e.box = ParamBox{space, offset, extent};
  e.numel = e.box.numel();
  return e;
}

TEST(ParamBox, RunsCoverExactlyTheBoxForEverySplitAndRange) {
  const int64_t C = 8, tp = 4, h = C / tp;
  std::vector<ParamEntry> cases;
  for (int64_t r = 0; r < tp; r++) {
    cases.push_back(entry({3, C, C}, {0, r * h, 0}, {3, h, C}));      // c_attn's heads
    cases.push_back(entry({4 * C, C}, {r * 2 * h, 0}, {2 * h, C}));  // column-parallel rows
    cases.push_back(entry({C, 4 * C}, {0, r * 2 * h}, {C, 2 * h}));  // row-parallel columns
    cases.push_back(entry({3, C}, {0, r * h}, {3, h}));              // c_attn's bias
    cases.push_back(entry({C}, {r * h}, {h}));
  }
  cases.push_back(entry({5, 7}, {0, 0}, {5, 7}));  // whole
  std::mt19937 rng(7);
  for (const ParamEntry& e : cases) {
    const std::vector<int64_t> want = global_indices(e.box);
    EXPECT_EQ(via_runs(e, 0, e.numel), want);
    for (int k = 0; k < 20; k++) {
      int64_t a = int64_t(rng() % uint32_t(e.numel + 1)), b = int64_t(rng() % uint32_t(e.numel + 1));
      if (a > b) std::swap(a, b);
      EXPECT_EQ(via_runs(e, a, b), std::vector<int64_t>(want.begin() + a, want.begin() + b));
    }
  }
}

TEST(ParamBox, AWholeBoxIsOneRun) {
  const ParamEntry e = entry({6, 5}, {0, 0}, {6, 5});
  int runs = 0;
  for_each_global_run(e, 3, 29, [&](int64_t gb, int64_t ge, int64_t local) {
    runs++;
    EXPECT_EQ(gb, 3);
    EXPECT_EQ(ge, 29);
    EXPECT_EQ(local, 3);
  });
  EXPECT_EQ(runs, 1);
}

TEST(ParamBox, ABoxThatDoesNotFitIsRefused) {
  ParamStore s;
  EXPECT_THROW(s.add_part("w", {2, 4}, {4, 4}, ParamBox{{4, 4}, {3, 0}, {2, 4}}, true), Error);  // leaves it
  EXPECT_THROW(s.add_part("w", {2, 4}, {4, 4}, ParamBox{{4, 4}, {0, 0}, {2, 3}}, true), Error);  // wrong numel
  EXPECT_THROW(s.add_part("w", {2, 4}, {4, 4}, ParamBox{{3, 4}, {0, 0}, {2, 4}}, true), Error);  // space != global
  EXPECT_NO_THROW(s.add_part("w", {2, 4}, {4, 4}, ParamBox{{4, 4}, {2, 0}, {2, 4}}, true));
}

}  // namespace
}  // namespace mt
