// Ring attention (parallel/ring_attention.h) against full-sequence attention on one rank: every rank
// draws the same whole sequence, computes the materialised attention (kernels/cpu/attention.cpp) and
// its gradient over all of it, then runs the ring on its zigzag rows and compares its rows:
//  - fp32: outputs, lse and gradients within 1e-5 relative, with and without packed documents that
//    span chunk boundaries, local lengths below and above the 64-row tile;
//  - a document ending on the first chunk's end hides rank 0's whole key block from every other rank's
//    queries: skipped (cp - 1 pairs in all) and the results still right;
//  - bf16: within 8e-3 x cp absolute of fp32 attention on the same (rounded) inputs (the bound
//    PyTorch's context-parallel tests allow);
//  - the bytes the cp communicator sent = the formula in ring_attention.h.
// Run under mpirun with 2 and 4 ranks: the whole world is the cp group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "parallel/ring_attention.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace mt::parallel {
namespace {

constexpr size_t sz(int64_t n) { return static_cast<size_t>(n); }
constexpr double kFloatTol = 1e-5;

struct Case {
  int B, T, C, NH;
};

// The whole sequence's attention, out (B,T,C), dqkv (B,T,3C) and lse (B,NH,T), on every rank.
struct Full {
  std::vector<float> out, dqkv, lse;
};
Full full_attention(const std::vector<float>& qkv, const std::vector<float>& dout, const int32_t* doc, const Case& c) {
  Full f;
  std::vector<float> att(sz(c.B) * c.NH * c.T * c.T), scratch(att.size()), lse_scr(sz(c.B) * c.NH * c.T);
  f.out.resize(dout.size());
  f.dqkv.resize(qkv.size());
  f.lse.resize(sz(c.B) * c.NH * c.T);
  cpu::attention_fwd<float>(f.out.data(), att.data(), qkv.data(), doc, c.B, c.T, c.C, c.NH);
  cpu::attention_bwd<float>(f.dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), doc, c.B, c.T, c.C,
                            c.NH);
  std::vector<float> fo(dout.size());  // lse from the flash twin (the materialised path keeps none)
  cpu::flash_attention_fwd<float>(fo.data(), f.lse.data(), qkv.data(), doc, c.B, c.T, c.C, c.NH);
  return f;
}

// This rank's rows of a (B,NH,T) array.
std::vector<float> take_lse(const std::vector<float>& lse, const Zigzag& z, int B, int NH) {
  std::vector<float> out(sz(B) * NH * z.local_len());
  z.take(out.data(), lse.data(), B * NH, 1);
  return out;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  return mt::testing::max_rel_error(a.data(), b.data(), a.size(), 1e-6);
}

struct RingRun {
  std::vector<float> out, lse, dqkv;
  RingStats fwd, bwd;
};

RingRun run_ring(Comm& cp, const std::vector<float>& qkv, const std::vector<float>& dout,
                 const std::vector<int32_t>* doc, const Case& c) {
  const Zigzag z{c.T, cp.size(), cp.rank()};
  const int Tl = z.local_len();
  std::vector<float> lq(sz(c.B) * Tl * 3 * c.C), ld(sz(c.B) * Tl * c.C);
  std::vector<int32_t> ldoc(sz(c.B) * Tl);
  z.take(lq.data(), qkv.data(), c.B, 3 * c.C);
  z.take(ld.data(), dout.data(), c.B, c.C);
  if (doc) z.take(ldoc.data(), doc->data(), c.B, 1);
  RingAttention ring(cp);
  RingRun r;
  r.out.resize(ld.size());
  r.lse.resize(sz(c.B) * c.NH * Tl);
  r.dqkv.resize(lq.size());
  const ops::Ctx ctx;
  const int32_t* ids = doc ? ldoc.data() : nullptr;  // on the CPU the host's copy is the array itself
  r.fwd = ring.forward(r.out.data(), r.lse.data(), lq.data(), ids, ids, c.B, Tl, c.C, c.NH, ctx);
  r.bwd = ring.backward(r.dqkv.data(), ld.data(), lq.data(), r.out.data(), r.lse.data(), ids, ids, c.B, Tl, c.C, c.NH,
                        ctx);
  return r;
}

void expect_matches(Comm& cp, const RingRun& r, const Full& f, const Case& c) {
  const Zigzag z{c.T, cp.size(), cp.rank()};
  std::vector<float> out(r.out.size()), dqkv(r.dqkv.size());
  z.take(out.data(), f.out.data(), c.B, c.C);
  z.take(dqkv.data(), f.dqkv.data(), c.B, 3 * c.C);
  EXPECT_LT(rel(r.out, out), kFloatTol);
  EXPECT_LT(rel(r.lse, take_lse(f.lse, z, c.B, c.NH)), kFloatTol);
  EXPECT_LT(rel(r.dqkv, dqkv), kFloatTol);
}

TEST(RingAttention, ZigzagRankHoldsChunksRAnd2CMinus1MinusR) {
  Comm& cp = testing::mpi_world().comm();
  const int P = cp.size(), r = cp.rank(), c = 3;
  const Zigzag z{2 * c * P, P, r};
  std::vector<int32_t> want;
  for (int t = 0; t < c; t++) want.push_back(r * c + t);
  for (int t = 0; t < c; t++) want.push_back((2 * P - 1 - r) * c + t);
  EXPECT_EQ(z.positions(), want);
  // Every position is held by exactly one rank.
  std::vector<int32_t> all(size_t(2 * c * P));
  cp.all_gather(want.data(), all.data(), want.size(), DType::i32);
  std::sort(all.begin(), all.end());
  for (int i = 0; i < 2 * c * P; i++) EXPECT_EQ(all[size_t(i)], i);
}

TEST(RingAttention, MatchesFullSequenceAttentionInFloat) {
  Comm& cp = testing::mpi_world().comm();
  const int P = cp.size();
  std::mt19937_64 rng(testing::shared_seed());
  // Local lengths 2 x 3 = 6 (tiny chunks) and 2 x 40 = 80 (more than one 64-row tile).
  for (const Case c : {Case{2, 2 * 3 * P, 12, 3}, Case{2, 2 * 40 * P, 8, 2}}) {
    for (bool with_doc : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "T = " << c.T << (with_doc ? ", documents" : ", causal"));
      auto doc = testing::random_doc_ids(c.B, c.T, rng);  // documents of 1 to T/3 tokens: they span chunks
      auto qkv = testing::random_floats(sz(c.B) * c.T * 3 * c.C, rng, -2.f, 2.f);
      auto dout = testing::random_floats(sz(c.B) * c.T * c.C, rng);
      const Full f = full_attention(qkv, dout, with_doc ? doc.data() : nullptr, c);
      const RingRun r = run_ring(cp, qkv, dout, with_doc ? &doc : nullptr, c);
      expect_matches(cp, r, f, c);
      EXPECT_EQ(r.fwd.computed + r.fwd.skipped, P);
    }
  }
}

TEST(RingAttention, KeyBlockHiddenByADocumentIsSkipped) {
  Comm& cp = testing::mpi_world().comm();
  const int P = cp.size();
  std::mt19937_64 rng(testing::shared_seed() + 1);
  const Case c{2, 2 * 5 * P, 8, 2};
  const int chunk = c.T / (2 * P);
  // Document 0 is chunk 0 exactly, in both rows; then row 0 is one document to the end, and row 1 has
  // documents of one chunk's length starting mid-chunk (each spans a chunk boundary). Rank 0 holds
  // chunks 0 and 2P-1: its keys are hidden from ranks 1..P-1 (chunk 0 by the document, chunk 2P-1 by
  // causality); every other pair sees something (row 0).
  std::vector<int32_t> doc(sz(c.B) * c.T);
  for (int t = 0; t < c.T; t++) {
    doc[sz(t)] = t < chunk ? 0 : 1;
    doc[sz(c.T + t)] = t < chunk ? 0 : 1 + (t + chunk / 2) / chunk;
  }
  auto qkv = testing::random_floats(sz(c.B) * c.T * 3 * c.C, rng, -2.f, 2.f);
  auto dout = testing::random_floats(sz(c.B) * c.T * c.C, rng);
  const Full f = full_attention(qkv, dout, doc.data(), c);
  const RingRun r = run_ring(cp, qkv, dout, &doc, c);
  expect_matches(cp, r, f, c);
  EXPECT_EQ(r.fwd.skipped, cp.rank() == 0 ? 0 : 1);
  EXPECT_EQ(r.bwd.skipped, r.fwd.skipped);
  int32_t skipped = r.fwd.skipped;
  cp.all_reduce(&skipped, 1, DType::i32, ReduceOp::sum);
  EXPECT_EQ(skipped, P - 1);
}

TEST(RingAttention, Bf16WithinTheContextParallelBound) {
  Comm& cp = testing::mpi_world().comm();
  const int P = cp.size();
  std::mt19937_64 rng(testing::shared_seed() + 2);
  const Case c{2, 2 * 20 * P, 16, 2};
  auto doc = testing::random_doc_ids(c.B, c.T, rng);
  auto qkv = testing::random_floats(sz(c.B) * c.T * 3 * c.C, rng, -2.f, 2.f);
  auto dout = testing::random_floats(sz(c.B) * c.T * c.C, rng);
  for (auto& x : qkv) x = load(store_as<bf16>(x));  // the same inputs for both precisions
  for (auto& x : dout) x = load(store_as<bf16>(x));
  const Full f = full_attention(qkv, dout, doc.data(), c);
  const Zigzag z{c.T, P, cp.rank()};
  const int Tl = z.local_len();
  std::vector<float> lq(sz(c.B) * Tl * 3 * c.C), ld(sz(c.B) * Tl * c.C), ref_out(ld.size()), ref_d(lq.size());
  std::vector<int32_t> ldoc(sz(c.B) * Tl);
  z.take(lq.data(), qkv.data(), c.B, 3 * c.C);
  z.take(ld.data(), dout.data(), c.B, c.C);
  z.take(ldoc.data(), doc.data(), c.B, 1);
  z.take(ref_out.data(), f.out.data(), c.B, c.C);
  z.take(ref_d.data(), f.dqkv.data(), c.B, 3 * c.C);
  std::vector<bf16> q16(lq.size()), d16(ld.size()), out16(ld.size()), dqkv16(lq.size());
  for (size_t i = 0; i < lq.size(); i++) q16[i] = store_as<bf16>(lq[i]);
  for (size_t i = 0; i < ld.size(); i++) d16[i] = store_as<bf16>(ld[i]);
  std::vector<float> lse(sz(c.B) * c.NH * Tl);
  RingAttention ring(cp);
  const ops::Ctx ctx;
  ring.forward(out16.data(), lse.data(), q16.data(), ldoc.data(), ldoc.data(), c.B, Tl, c.C, c.NH, ctx);
  ring.backward(dqkv16.data(), d16.data(), q16.data(), out16.data(), lse.data(), ldoc.data(), ldoc.data(), c.B, Tl,
                c.C, c.NH, ctx);
  double e_out = 0, e_d = 0;
  for (size_t i = 0; i < out16.size(); i++) e_out = std::max(e_out, std::fabs(double(load(out16[i])) - ref_out[i]));
  for (size_t i = 0; i < dqkv16.size(); i++) e_d = std::max(e_d, std::fabs(double(load(dqkv16[i])) - ref_d[i]));
  EXPECT_LT(e_out, 8e-3 * P);
  EXPECT_LT(e_d, 8e-3 * P);
}

TEST(RingAttention, BytesSentOnTheCpGroupFollowTheFormula) {
  Comm& cp = testing::mpi_world().comm();
  const int P = cp.size();
  std::mt19937_64 rng(testing::shared_seed() + 3);
  const Case c{2, 2 * 4 * P, 8, 2};
  auto doc = testing::random_doc_ids(c.B, c.T, rng);
  auto qkv = testing::random_floats(sz(c.B) * c.T * 3 * c.C, rng);
  auto dout = testing::random_floats(sz(c.B) * c.T * c.C, rng);
  for (bool with_doc : {false, true}) {
    cp.reset_counters();
    run_ring(cp, qkv, dout, with_doc ? &doc : nullptr, c);
    const uint64_t Nl = uint64_t(c.B) * (c.T / P), kv = Nl * 2 * c.C;
    const uint64_t docs = with_doc ? 2 * (P - 1) * Nl * 4 : 0;
    const uint64_t expect = (P - 1) * kv * 4 + (P - 1) * kv * 4 + P * kv * 4 + docs;  // fwd kv, bwd kv, bwd dkv
    EXPECT_EQ(cp.counters()[CommOp::send].sent_bytes, expect) << (with_doc ? "documents" : "causal");
    EXPECT_EQ(cp.counters().total_sent_bytes(), expect);
  }
}

}  // namespace
}  // namespace mt::parallel
