// The op timer (kernels/op_timer.h): every op dispatched with a timer in its Ctx is counted under its
// own name with its FLOPs, ops without a timer are not, and misuse (nesting, end without begin) fails.
// Host regions nest and hold ops, each counted with its own time; a region inside an op is the op's.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "kernels/op_timer.h"
#include "kernels/ops.h"
#include "runtime/check.h"

namespace mt::ops {
namespace {

const OpTotal* find(const std::vector<OpTotal>& ts, const std::string& op) {
  for (const OpTotal& t : ts)
    if (t.op == op) return &t;
  return nullptr;
}

TEST(OpTimer, CountsEachDispatchedOpWithItsFlops) {
  auto timer = make_host_timer();
  Ctx ctx;
  ctx.timer = timer.get();
  const int N = 3, IC = 5, OC = 7;
  std::vector<float> in(N * IC, 0.5f), w(OC * IC, 0.25f), out(N * OC), dout(N * OC, 1.f), din(N * IC);
  std::vector<float> dw(OC * IC), db(OC);
  matmul_fwd(out.data(), in.data(), w.data(), static_cast<const float*>(nullptr), N, IC, OC, ctx);
  matmul_fwd(out.data(), in.data(), w.data(), static_cast<const float*>(nullptr), N, IC, OC, ctx);
  matmul_bwd(din.data(), dw.data(), db.data(), dout.data(), in.data(), w.data(), N, IC, OC, ctx);
  matmul_bwd(static_cast<float*>(nullptr), dw.data(), db.data(), dout.data(), in.data(), w.data(), N, IC, OC, ctx);
  add(out.data(), out.data(), out.data(), int64_t(out.size()), ctx);
  Ctx untimed;  // no timer: not counted
  add(out.data(), out.data(), out.data(), int64_t(out.size()), untimed);

  const std::vector<OpTotal> ts = timer->totals();
  ASSERT_EQ(ts.size(), 3u);
  EXPECT_EQ(ts[0].op, "matmul_fwd");  // order of first appearance
  const OpTotal* f = find(ts, "matmul_fwd");
  const OpTotal* b = find(ts, "matmul_bwd");
  const OpTotal* a = find(ts, "add");
  ASSERT_TRUE(f && b && a);
  EXPECT_EQ(f->calls, 2);
  EXPECT_DOUBLE_EQ(f->flops, 2 * 2.0 * N * IC * OC);
  EXPECT_EQ(b->calls, 2);
  EXPECT_DOUBLE_EQ(b->flops, 4.0 * N * IC * OC + 2.0 * N * IC * OC);  // with dinp, then without
  EXPECT_EQ(a->calls, 1);
  EXPECT_EQ(a->flops, 0.0);
  // Least traffic: each input read once, each output written once (fp32 here).
  EXPECT_DOUBLE_EQ(f->bytes, 2 * 4.0 * (N * IC + IC * OC + N * OC));
  // dout, inp and dweight (read and written), plus the weight and dinp when dinp is asked for.
  EXPECT_DOUBLE_EQ(b->bytes, 4.0 * (N * OC + N * IC + IC * OC + N * IC) + 8.0 * IC * OC + 4.0 * (N * OC + N * IC) +
                                 8.0 * IC * OC);
  EXPECT_DOUBLE_EQ(a->bytes, 3 * 4.0 * double(out.size()));
  for (const OpTotal& t : ts) EXPECT_GE(t.seconds, 0.0);

  timer->reset();
  EXPECT_TRUE(timer->totals().empty());
}

TEST(OpTimer, CountsCausalAttentionFlops) {
  auto timer = make_host_timer();
  Ctx ctx;
  ctx.timer = timer.get();
  const int B = 2, T = 5, C = 8, NH = 2;
  std::vector<float> qkv(size_t(B) * T * 3 * C, 0.1f), out(size_t(B) * T * C), lse(size_t(B) * NH * T);
  flash_attention_fwd(out.data(), lse.data(), qkv.data(), nullptr, B, T, C, NH, ctx);
  const std::vector<OpTotal> ts = timer->totals();
  ASSERT_EQ(ts.size(), 1u);
  // 2 products x 15 visible pairs x hs 4 x 2 FLOPs, per (b, h).
  EXPECT_DOUBLE_EQ(ts[0].flops, double(B) * NH * 2 * (T * (T + 1) / 2) * (C / NH) * 2);
}

TEST(OpTimer, RejectsNestedAndUnmatchedMarks) {
  auto timer = make_host_timer();
  EXPECT_THROW(timer->end(), Error);
  timer->begin("outer", 0);
  EXPECT_THROW(timer->begin("inner", 0), Error);
  EXPECT_THROW(timer->reset(), Error);
  timer->end();
  EXPECT_EQ(timer->totals().size(), 1u);
}

// Marks at fixed times (mark k at k^2 seconds), so that own times are exact.
class SquareTimer final : public OpTimer {
  size_t next_ = 0;

 protected:
  size_t mark() override { return next_++; }
  double seconds_between(size_t a, size_t b) override { return double(b * b) - double(a * a); }
  void clear_marks() override { next_ = 0; }
};

TEST(OpTimer, RegionsCountTheirOwnTimeWithoutTheOpsAndRegionsInside) {
  SquareTimer t;
  t.begin_region("outer");  // mark 0 (0 s)
  t.begin("op", 10);        // 1
  t.end();                  // 4: the op took 3 s
  t.begin_region("inner");  // 9
  t.end_region();           // 16: 7 s
  t.end_region();           // 25: outer's own time 25 - 3 - 7 = 15 s
  t.begin_region("outer");  // 36
  t.end_region();           // 49: 13 s more
  t.begin("op2", 0);        // 64
  t.begin_region("inside an op");  // part of op2: not recorded
  t.end_region();
  t.end();  // 81: op2 17 s
  const std::vector<OpTotal> ts = t.totals();
  ASSERT_EQ(ts.size(), 4u);
  const OpTotal *outer = find(ts, "outer"), *inner = find(ts, "inner"), *op = find(ts, "op"), *op2 = find(ts, "op2");
  ASSERT_TRUE(outer && inner && op && op2);
  EXPECT_TRUE(outer->region);
  EXPECT_TRUE(inner->region);
  EXPECT_FALSE(op->region);
  EXPECT_EQ(outer->calls, 2);
  EXPECT_DOUBLE_EQ(outer->seconds, 15.0 + 13.0);
  EXPECT_DOUBLE_EQ(inner->seconds, 7.0);
  EXPECT_DOUBLE_EQ(op->seconds, 3.0);
  EXPECT_DOUBLE_EQ(op->flops, 10.0);
  EXPECT_DOUBLE_EQ(op2->seconds, 17.0);
  // Everything together is the time covered: 0-25, 36-49 and 64-81 s (not the gaps between).
  double sum = 0;
  for (const OpTotal& x : ts) sum += x.seconds;
  EXPECT_DOUBLE_EQ(sum, 25.0 + 13.0 + 17.0);
}

TEST(OpTimer, RejectsUnmatchedRegions) {
  SquareTimer t;
  EXPECT_THROW(t.end_region(), Error);
  t.begin_region("open");
  EXPECT_THROW(t.totals(), Error);
  EXPECT_THROW(t.reset(), Error);
  t.begin("op", 0);
  EXPECT_THROW(t.end_region(), Error);  // open began outside the op
  t.end();
  t.end_region();
  EXPECT_EQ(t.totals().size(), 2u);
}

// The sink the trainer hands to its Ctx and arena: regions reach the timer and, while the trace records,
// become spans of category "host" on the given lane; other threads' regions are not heard.
TEST(OpTimer, RegionsSinkFeedsTheTimerAndTheTraceFromItsOwnThreadOnly) {
  SquareTimer timer;
  Trace trace(0, "test");
  const int lane = trace.lane("ops");
  Regions sink(&timer, &trace, lane);
  trace.set_recording(true);
  Ctx ctx;
  ctx.regions = &sink;
  { const Region r(ctx, "loss"); }
  std::thread other([&] { const Region r(ctx, "elsewhere"); });
  other.join();
  const std::vector<OpTotal> ts = timer.totals();
  ASSERT_EQ(ts.size(), 1u);
  EXPECT_EQ(ts[0].op, "loss");
  EXPECT_TRUE(ts[0].region);
  EXPECT_EQ(trace.events(), 1u);
  EXPECT_NE(trace.json().find("\"loss\""), std::string::npos);
  EXPECT_NE(trace.json().find("\"host\""), std::string::npos);
}

}  // namespace
}  // namespace mt::ops
