// The op timer (kernels/op_timer.h): every op dispatched with a timer in its Ctx is counted under its
// own name with its FLOPs, ops without a timer are not, and misuse (nesting, end without begin) fails.
#include <gtest/gtest.h>

#include <string>
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

}  // namespace
}  // namespace mt::ops
