// Document masking in attention: a sequence packed from several documents, run with doc ids, must
// give every document exactly what running that document alone gives (forward output, attention
// probabilities and the backward's dqkv), and no attention across documents. The rule is
// "token i attends to j iff j <= i and doc[i] == doc[j]", so even interleaved ids must behave like
// separate sequences made of each id's tokens in order.
//
// Tolerances: float arithmetic with the same formulas but different blocking and summation order
// between the packed and the standalone run, so results agree to rounding: kTol = 2e-6 relative
// to the largest magnitude (measured differences are ~1e-7).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/test_util.h"

namespace mt::cpu {
namespace {

constexpr size_t sz(int64_t n) { return static_cast<size_t>(n); }

constexpr double kTol = 2e-6;

struct AttnResult {
  std::vector<float> out, att, dqkv;
};

// Attention forward + backward on one batch of B sequences.
AttnResult run_attention(const std::vector<float>& qkv, const std::vector<float>& dout, const int32_t* doc, int B,
                         int T, int C, int NH) {
  AttnResult r;
  r.out.assign(sz(B) * T * C, 0.f);
  r.att.assign(sz(B) * NH * T * T, 0.f);
  r.dqkv.assign(qkv.size(), 0.f);
  std::vector<float> scratch(r.att.size());
  attention_fwd<float>(r.out.data(), r.att.data(), qkv.data(), doc, B, T, C, NH);
  attention_bwd<float>(r.dqkv.data(), scratch.data(), dout.data(), qkv.data(), r.att.data(), doc, B, T, C, NH);
  return r;
}

// Tokens `idx` (positions in batch row b) of a (B,T,W) tensor, as a (1,len,W) tensor.
std::vector<float> gather(const std::vector<float>& x, int b, int T, int W, const std::vector<int>& idx) {
  std::vector<float> g;
  for (int t : idx) {
    const float* row = x.data() + (sz(b) * T + sz(t)) * W;
    g.insert(g.end(), row, row + W);
  }
  return g;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  return mt::testing::max_rel_error(a.data(), b.data(), a.size(), 1e-6);
}

// Checks the packed run against one standalone run per (batch row, doc id).
void expect_documents_independent(const std::vector<int32_t>& doc, int B, int T, int C, int NH, std::mt19937_64& rng) {
  auto qkv = mt::testing::random_floats(sz(B) * T * 3 * C, rng, -2.f, 2.f);
  auto dout = mt::testing::random_floats(sz(B) * T * C, rng);
  const AttnResult packed = run_attention(qkv, dout, doc.data(), B, T, C, NH);
  for (int b = 0; b < B; b++) {
    std::map<int32_t, std::vector<int>> tokens_of;
    for (int t = 0; t < T; t++) tokens_of[doc[sz(b) * T + sz(t)]].push_back(t);
    for (const auto& [id, idx] : tokens_of) {
      SCOPED_TRACE(::testing::Message() << "batch row " << b << ", doc " << id << " (" << idx.size() << " tokens)");
      const int L = int(idx.size());
      const AttnResult alone =
          run_attention(gather(qkv, b, T, 3 * C, idx), gather(dout, b, T, C, idx), nullptr, 1, L, C, NH);
      EXPECT_LT(rel(gather(packed.out, b, T, C, idx), alone.out), kTol);
      EXPECT_LT(rel(gather(packed.dqkv, b, T, 3 * C, idx), alone.dqkv), kTol);
      for (int h = 0; h < NH; h++)
        for (int i = 0; i < L; i++)
          for (int t = 0; t < T; t++) {
            const float p = packed.att[((sz(b) * NH + sz(h)) * T + sz(idx[sz(i)])) * T + sz(t)];
            auto it = std::find(idx.begin(), idx.end(), t);
            if (it == idx.end()) {
              ASSERT_EQ(p, 0.f) << "token " << idx[sz(i)] << " attends to token " << t << " of another document";
            } else {
              const float q = alone.att[(sz(h) * L + sz(i)) * L + sz(it - idx.begin())];
              ASSERT_NEAR(p, q, kTol);
            }
          }
    }
  }
}

TEST(AttentionMask, PackedDocumentsEachGetTheirStandaloneResult) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const int B = 2, T = 150, C = 12, NH = 3;  // T spans several row blocks of the kernel
  std::vector<int32_t> doc(sz(B) * T);
  std::uniform_int_distribution<int> len(1, 60);
  for (int b = 0; b < B; b++) {
    int id = 0, left = len(rng);
    for (int t = 0; t < T; t++) {
      if (left-- == 0) {
        id++;
        left = len(rng) - 1;
      }
      doc[sz(b) * T + sz(t)] = id;
    }
  }
  expect_documents_independent(doc, B, T, C, NH, rng);
}

TEST(AttentionMask, InterleavedDocIdsBehaveLikeSeparateSequences) {
  std::mt19937_64 rng(mt::testing::test_seed() + 1);
  const int B = 1, T = 41, C = 10, NH = 2;
  std::vector<int32_t> doc(sz(B) * T);
  std::uniform_int_distribution<int> id(0, 2);
  for (auto& d : doc) d = id(rng);
  expect_documents_independent(doc, B, T, C, NH, rng);
}

TEST(AttentionMask, OneDocumentEqualsPlainCausalAttention) {
  std::mt19937_64 rng(mt::testing::test_seed() + 2);
  const int B = 2, T = 70, C = 8, NH = 2;
  auto qkv = mt::testing::random_floats(sz(B) * T * 3 * C, rng, -2.f, 2.f);
  auto dout = mt::testing::random_floats(sz(B) * T * C, rng);
  std::vector<int32_t> doc(sz(B) * T, 7);
  const AttnResult masked = run_attention(qkv, dout, doc.data(), B, T, C, NH);
  const AttnResult causal = run_attention(qkv, dout, nullptr, B, T, C, NH);
  EXPECT_EQ(masked.out, causal.out);
  EXPECT_EQ(masked.att, causal.att);
  EXPECT_EQ(masked.dqkv, causal.dqkv);
}

}  // namespace
}  // namespace mt::cpu
