// Block attention (kernels/cpu/flash_attention_block.cpp), ring attention's kernel, against the
// materialised attention (attention.cpp):
//  - a sequence cut into blocks of arbitrary rows (random subsets: random global positions, documents
//    spanning blocks), every query block run against every key block and merged by log-sum-exp, gives
//    the materialised output and, with the merged lse and D, its gradient;
//  - contiguous blocks where a document starts on a block boundary: the earlier key block is wholly
//    masked for the later queries (attention_block_hidden says so) and the results still match;
//  - a query with no visible key: output 0, lse -inf, no gradient, never NaN;
//  - the backward of one block pair matches central finite differences in double.
// Tolerances as in test_kernels_flash_attention.cpp: kFloatTol = 1e-5 relative to the largest value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/test_util.h"

namespace mt::cpu {
namespace {

constexpr size_t sz(int64_t n) { return static_cast<size_t>(n); }
constexpr double kFloatTol = 1e-5;
constexpr double kFdStep = 1e-5;
constexpr double kFdTol = 1e-6;

// One block: the rows `idx` of a (B,T,3C) qkv, as a (B,n,3C) qkv of its own with positions and docs.
struct Block {
  std::vector<int> idx;
  std::vector<int32_t> pos, doc;
  std::vector<float> qkv;
};

Block take_block(const std::vector<int>& idx, const std::vector<float>& qkv, const std::vector<int32_t>& doc, int B,
                 int T, int C) {
  Block b;
  b.idx = idx;
  const int n = int(idx.size());
  for (int i : idx) b.pos.push_back(i);
  b.doc.resize(sz(B) * n);
  b.qkv.resize(sz(B) * n * 3 * C);
  for (int r = 0; r < B; r++)
    for (int t = 0; t < n; t++) {
      b.doc[sz(r) * n + sz(t)] = doc[sz(r) * T + sz(idx[sz(t)])];
      std::copy_n(qkv.begin() + std::ptrdiff_t((sz(r) * T + sz(idx[sz(t)])) * 3 * C), 3 * C,
                  b.qkv.begin() + std::ptrdiff_t((sz(r) * n + sz(t)) * 3 * C));
    }
  return b;
}

// Runs every query block against every key block, merging forward outputs by lse, then the backward
// of every pair; returns out (B,T,C) and dqkv (B,T,3C) in the sequence's own row order. Counts the
// pairs attention_block_hidden skips.
void run_blocks(const std::vector<Block>& blocks, const std::vector<float>& dout, int B, int T, int C, int NH,
                bool with_doc, std::vector<float>& out, std::vector<float>& dqkv, int* skipped) {
  out.assign(sz(B) * T * C, 0.f);
  dqkv.assign(sz(B) * T * 3 * C, 0.f);
  *skipped = 0;
  const size_t nb = blocks.size();
  std::vector<std::vector<float>> O(nb), L(nb), dq(nb), dkv(nb);
  for (size_t i = 0; i < nb; i++) {
    const int n = int(blocks[i].idx.size());
    O[i].assign(sz(B) * n * C, 0.f);
    L[i].assign(sz(B) * NH * n, -INFINITY);
    dq[i].assign(sz(B) * n * C, 0.f);
    dkv[i].assign(sz(B) * n * 2 * C, 0.f);
  }
  auto docp = [&](const Block& b) { return with_doc ? b.doc.data() : nullptr; };
  for (size_t i = 0; i < nb; i++)
    for (size_t j = 0; j < nb; j++) {
      const Block &q = blocks[i], &k = blocks[j];
      const int Tq = int(q.idx.size()), Tk = int(k.idx.size());
      if (attention_block_hidden(q.pos.data(), k.pos.data(), docp(q), docp(k), B, Tq, Tk)) {
        ++*skipped;
        continue;
      }
      std::vector<float> po(sz(B) * Tq * C, std::numeric_limits<float>::quiet_NaN()), pl(sz(B) * NH * Tq);
      flash_block_fwd<float>(po.data(), pl.data(), q.qkv.data(), 3 * C, k.qkv.data() + C, k.qkv.data() + 2 * C,
                             3 * C, q.pos.data(), k.pos.data(), docp(q), docp(k), B, Tq, Tk, C, NH);
      attention_merge<float>(O[i].data(), L[i].data(), po.data(), pl.data(), B, Tq, C, NH);
    }
  for (size_t i = 0; i < nb; i++) {
    const Block& q = blocks[i];
    const int Tq = int(q.idx.size());
    std::vector<float> go(sz(B) * Tq * C), D(sz(B) * NH * Tq);
    for (int r = 0; r < B; r++)
      for (int t = 0; t < Tq; t++)
        std::copy_n(dout.begin() + std::ptrdiff_t((sz(r) * T + sz(q.idx[sz(t)])) * C), C,
                    go.begin() + std::ptrdiff_t((sz(r) * Tq + sz(t)) * C));
    attention_delta<float>(D.data(), go.data(), O[i].data(), B, Tq, C, NH);
    for (size_t j = 0; j < nb; j++) {
      const Block& k = blocks[j];
      const int Tk = int(k.idx.size());
      if (attention_block_hidden(q.pos.data(), k.pos.data(), docp(q), docp(k), B, Tq, Tk)) continue;
      flash_block_bwd<float>(dq[i].data(), dkv[j].data(), dkv[j].data() + C, 2 * C, go.data(), q.qkv.data(), 3 * C,
                             k.qkv.data() + C, k.qkv.data() + 2 * C, 3 * C, L[i].data(), D.data(), q.pos.data(),
                             k.pos.data(), docp(q), docp(k), B, Tq, Tk, C, NH);
    }
  }
  for (size_t i = 0; i < nb; i++) {
    const int n = int(blocks[i].idx.size());
    for (int r = 0; r < B; r++)
      for (int t = 0; t < n; t++) {
        const size_t g = sz(r) * T + sz(blocks[i].idx[sz(t)]), l = sz(r) * n + sz(t);
        std::copy_n(O[i].begin() + std::ptrdiff_t(l * C), C, out.begin() + std::ptrdiff_t(g * C));
        std::copy_n(dq[i].begin() + std::ptrdiff_t(l * C), C, dqkv.begin() + std::ptrdiff_t(g * 3 * C));
        std::copy_n(dkv[i].begin() + std::ptrdiff_t(l * 2 * C), 2 * C, dqkv.begin() + std::ptrdiff_t(g * 3 * C + C));
      }
  }
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  return mt::testing::max_rel_error(a.data(), b.data(), a.size(), 1e-6);
}

struct Reference {
  std::vector<float> out, dqkv;
};

Reference materialised(const std::vector<float>& qkv, const std::vector<float>& dout, const int32_t* doc, int B,
                       int T, int C, int NH) {
  Reference r;
  std::vector<float> att(sz(B) * NH * T * T), scratch(att.size());
  r.out.resize(dout.size());
  r.dqkv.resize(qkv.size());
  attention_fwd<float>(r.out.data(), att.data(), qkv.data(), doc, B, T, C, NH);
  attention_bwd<float>(r.dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), doc, B, T, C, NH);
  return r;
}

TEST(FlashBlock, RandomBlocksMergedByLseEqualTheMaterialisedAttention) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const int B = 2, C = 12, NH = 3;
  for (int T : {9, 70, 150}) {  // 150: blocks of more than one 64-row tile
    for (bool with_doc : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "T = " << T << (with_doc ? ", doc ids" : ", causal"));
      auto doc = testing::random_doc_ids(B, T, rng);
      auto qkv = mt::testing::random_floats(sz(B) * T * 3 * C, rng, -2.f, 2.f);
      auto dout = mt::testing::random_floats(sz(B) * T * C, rng);
      const Reference ref = materialised(qkv, dout, with_doc ? doc.data() : nullptr, B, T, C, NH);
      // Three blocks of random rows (random sizes, each row's position its place in the sequence).
      std::vector<int> perm(sz(T));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      const int a = 1 + int(rng() % sz(T / 2)), b = a + 1 + int(rng() % sz(T - a - 1));
      std::vector<Block> blocks;
      for (auto [lo, hi] : {std::pair{0, a}, std::pair{a, b}, std::pair{b, T}})
        blocks.push_back(take_block(std::vector<int>(perm.begin() + lo, perm.begin() + hi), qkv, doc, B, T, C));
      std::vector<float> out, dqkv;
      int skipped = 0;
      run_blocks(blocks, dout, B, T, C, NH, with_doc, out, dqkv, &skipped);
      EXPECT_LT(rel(out, ref.out), kFloatTol);
      EXPECT_LT(rel(dqkv, ref.dqkv), kFloatTol);
    }
  }
}

TEST(FlashBlock, KeyBlockWhollyMaskedByADocumentIsSkippedAndResultsStillMatch) {
  std::mt19937_64 rng(mt::testing::test_seed() + 2);
  const int B = 2, T = 96, C = 8, NH = 2, n = 32;
  // Row 0: document 0 is the first block, document 1 spans blocks 1 and 2. Row 1: one document.
  std::vector<int32_t> doc(sz(B) * T, 0);
  for (int t = n; t < T; t++) doc[sz(t)] = 1;
  auto qkv = mt::testing::random_floats(sz(B) * T * 3 * C, rng, -2.f, 2.f);
  auto dout = mt::testing::random_floats(sz(B) * T * C, rng);
  const Reference ref = materialised(qkv, dout, doc.data(), B, T, C, NH);
  std::vector<Block> blocks;
  for (int k = 0; k < T / n; k++) {
    std::vector<int> idx(sz(n));
    std::iota(idx.begin(), idx.end(), k * n);
    blocks.push_back(take_block(idx, qkv, doc, B, T, C));
  }
  // With one batch row the later blocks cannot see block 0 (row 1 can): hidden only where every row agrees.
  EXPECT_FALSE(attention_block_hidden(blocks[2].pos.data(), blocks[0].pos.data(), blocks[2].doc.data(),
                                      blocks[0].doc.data(), B, n, n));
  EXPECT_TRUE(attention_block_hidden(blocks[2].pos.data(), blocks[0].pos.data(), blocks[2].doc.data(),
                                     blocks[0].doc.data(), 1, n, n));
  std::vector<float> out, dqkv;
  int skipped = 0;
  run_blocks(blocks, dout, B, T, C, NH, true, out, dqkv, &skipped);
  EXPECT_EQ(skipped, 3);  // causality: (0,1), (0,2), (1,2)
  EXPECT_LT(rel(out, ref.out), kFloatTol);
  EXPECT_LT(rel(dqkv, ref.dqkv), kFloatTol);
  // Batch row 0 alone: block 0 is also hidden from blocks 1 and 2 by its document.
  std::vector<Block> row0;
  for (const Block& b : blocks) {
    Block r = b;
    r.doc.resize(sz(n));
    r.qkv.resize(sz(n) * 3 * C);
    row0.push_back(r);
  }
  std::vector<float> qkv0(qkv.begin(), qkv.begin() + std::ptrdiff_t(T * 3 * C)),
      dout0(dout.begin(), dout.begin() + std::ptrdiff_t(T * C));
  const Reference ref0 = materialised(qkv0, dout0, doc.data(), 1, T, C, NH);
  run_blocks(row0, dout0, 1, T, C, NH, true, out, dqkv, &skipped);
  EXPECT_EQ(skipped, 5);
  EXPECT_LT(rel(out, ref0.out), kFloatTol);
  EXPECT_LT(rel(dqkv, ref0.dqkv), kFloatTol);
}

TEST(FlashBlock, QueryWithoutVisibleKeyGivesZeroOutputMinusInfLseAndNoGradient) {
  std::mt19937_64 rng(mt::testing::test_seed() + 3);
  const int B = 1, Tq = 5, Tk = 70, C = 8, NH = 2;
  // Queries at positions 0..4; keys at 3..72: queries 0-2 see nothing, 3 and 4 see keys 3 and 3, 4.
  std::vector<int32_t> qp(Tq), kp(Tk);
  std::iota(qp.begin(), qp.end(), 0);
  std::iota(kp.begin(), kp.end(), 3);
  auto q = mt::testing::random_floats(sz(B) * Tq * C, rng);
  auto kv = mt::testing::random_floats(sz(B) * Tk * 2 * C, rng);
  auto go = mt::testing::random_floats(sz(B) * Tq * C, rng);
  std::vector<float> out(sz(B) * Tq * C, 7.f), lse(sz(B) * NH * Tq, 7.f);
  flash_block_fwd<float>(out.data(), lse.data(), q.data(), C, kv.data(), kv.data() + C, 2 * C, qp.data(), kp.data(),
                         nullptr, nullptr, B, Tq, Tk, C, NH);
  for (int h = 0; h < NH; h++)
    for (int t = 0; t < Tq; t++) {
      const float L = lse[sz(h) * Tq + sz(t)];
      if (t < 3) EXPECT_EQ(L, -INFINITY) << "query " << t;
      else EXPECT_TRUE(std::isfinite(L)) << "query " << t;
    }
  for (int t = 0; t < 3; t++)
    for (int c = 0; c < C; c++) EXPECT_EQ(out[sz(t) * C + sz(c)], 0.f);
  std::vector<float> D(lse.size()), dq(out.size(), 0.f), dkv(kv.size(), 0.f);
  attention_delta<float>(D.data(), go.data(), out.data(), B, Tq, C, NH);
  flash_block_bwd<float>(dq.data(), dkv.data(), dkv.data() + C, 2 * C, go.data(), q.data(), C, kv.data(),
                         kv.data() + C, 2 * C, lse.data(), D.data(), qp.data(), kp.data(), nullptr, nullptr, B, Tq,
                         Tk, C, NH);
  for (float x : dq) EXPECT_TRUE(std::isfinite(x));
  for (float x : dkv) EXPECT_TRUE(std::isfinite(x));
  for (int t = 0; t < 3; t++)
    for (int c = 0; c < C; c++) EXPECT_EQ(dq[sz(t) * C + sz(c)], 0.f);
  for (int t = 2; t < Tk; t++)  // keys at positions >= 5 are seen by no query
    for (int c = 0; c < 2 * C; c++) EXPECT_EQ(dkv[sz(t) * 2 * C + sz(c)], 0.f);
}

// L = sum(R * out_blk) of one block pair; its backward, with the block's own lse and D, must give
// dL/dq, dL/dk, dL/dv. Random positions (some queries see nothing) and documents.
TEST(FlashBlock, BackwardMatchesFiniteDifferencesInDouble) {
  std::mt19937_64 rng(mt::testing::test_seed() + 4);
  const int B = 2, Tq = 6, Tk = 67, C = 4, NH = 2;
  std::vector<int32_t> qp(Tq), kp(Tk), qd(sz(B) * Tq), kd(sz(B) * Tk);
  for (auto& p : qp) p = int32_t(rng() % 80);
  for (auto& p : kp) p = int32_t(1 + rng() % 80);
  qp[0] = 0;  // before every key: this query sees nothing
  for (auto& d : qd) d = int32_t(rng() % 2);
  for (auto& d : kd) d = int32_t(rng() % 2);
  auto q = mt::testing::random_doubles(sz(B) * Tq * C, rng, -2, 2);
  auto kv = mt::testing::random_doubles(sz(B) * Tk * 2 * C, rng, -2, 2);
  auto R = mt::testing::random_doubles(sz(B) * Tq * C, rng);
  std::vector<double> out(R.size()), lse(sz(B) * NH * Tq);
  auto loss = [&] {
    flash_block_fwd<double>(out.data(), lse.data(), q.data(), C, kv.data(), kv.data() + C, 2 * C, qp.data(),
                            kp.data(), qd.data(), kd.data(), B, Tq, Tk, C, NH);
    double l = 0;
    for (size_t i = 0; i < out.size(); i++) l += out[i] * R[i];
    return l;
  };
  loss();
  std::vector<double> D(lse.size()), dq(q.size(), 0.0), dkv(kv.size(), 0.0);
  attention_delta<double>(D.data(), R.data(), out.data(), B, Tq, C, NH);
  flash_block_bwd<double>(dq.data(), dkv.data(), dkv.data() + C, 2 * C, R.data(), q.data(), C, kv.data(),
                          kv.data() + C, 2 * C, lse.data(), D.data(), qp.data(), kp.data(), qd.data(), kd.data(), B,
                          Tq, Tk, C, NH);
  auto numeric = [&](std::vector<double>& x) { return mt::testing::central_differences(loss, x, kFdStep); };
  const auto nq = numeric(q), nkv = numeric(kv);
  EXPECT_LT(mt::testing::max_rel_error(dq.data(), nq.data(), dq.size(), 1e-8), kFdTol);
  EXPECT_LT(mt::testing::max_rel_error(dkv.data(), nkv.data(), dkv.size(), 1e-8), kFdTol);
  EXPECT_EQ(lse[0], -INFINITY);
}

}  // namespace
}  // namespace mt::cpu
