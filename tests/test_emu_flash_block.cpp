// The block flash attention kernels of ring attention (kernels/cuda/flash_block_kernels.cuh), built by
// the host compiler and run on the warp emulator against the CPU twin
// (kernels/cpu/flash_attention_block.cpp), in float, bf16 and fp16 inputs (the outputs are fp32 on both
// sides, so fp32 bounds hold for every input type). The block pairs are the ones ring attention meets:
// a zigzag rank's own chunks (the diagonal), a later chunk whose queries see all of an earlier one,
// and an earlier chunk whose queries see none of the keys (output 0, log-sum-exp -inf, no gradient);
// with packed-document ids, a key block of other documents only. Head sizes 8 .. 128 (every lane
// split), partial 64-row tiles, Tq != Tk. The backward adds to dq, dk, dv that start nonzero.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/flash_block_kernels.cuh"
#include "kernels/cuda/tolerances.h"
#include "runtime/storage.h"
#include "tests/emu_test_util.h"
#include "tests/test_util.h"

namespace {

using namespace mt::testing::emu;
using mt::cuda::dev_ptr;
using mt::testing::kLseFloor;
using mt::testing::max_rel_error;
namespace bk = mt::cuda::flash_block_kernels;
namespace fk = mt::cuda::flash_attention_kernels;
namespace tol = mt::cuda::tol;

// A query block and a key block cut from one packed sequence of length T: positions [q0, q0 + Tq) and
// [k0, k0 + Tk) (zigzag pairs are made of two such pieces, see pieces), document ids from the sequence's.
struct Pair {
  const char* what;
  int B, T, C, NH;
  std::vector<std::pair<int, int>> q_pieces, k_pieces;  // (first position, rows)
  bool docs;
  bool other_docs = false;  // the keys' documents replaced by ids no query has
};

std::vector<int32_t> positions(const std::vector<std::pair<int, int>>& pieces) {
  std::vector<int32_t> p;
  for (const auto& [first, rows] : pieces)
    for (int r = 0; r < rows; r++) p.push_back(first + r);
  return p;
}

// Zigzag with cp ranks and chunk c: rank r holds chunks r and 2 cp - 1 - r.
std::vector<std::pair<int, int>> zigzag(int rank, int cp, int c) { return {{rank * c, c}, {(2 * cp - 1 - rank) * c, c}}; }

const Pair kPairs[] = {
    {"zigzag cp2 rank 0 own chunks (the diagonal), docs", 2, 4 * 40, 32, 4, zigzag(0, 2, 40), zigzag(0, 2, 40), true},
    {"zigzag cp2 rank 0's queries, rank 1's keys", 1, 4 * 40, 96, 2, zigzag(0, 2, 40), zigzag(1, 2, 40), false},
    {"a later chunk over an earlier one, hs 80", 1, 200, 80, 1, {{130, 70}}, {{0, 65}}, true},
    {"an earlier chunk over a later one: nothing visible", 2, 200, 26, 2, {{0, 33}}, {{100, 40}}, false},
    {"keys of other documents only", 2, 160, 128, 1, {{90, 70}}, {{10, 33}}, true, true},
    {"one query, one key, hs 8", 1, 8, 8, 1, {{5, 1}}, {{2, 1}}, false},
    {"zigzag cp4 rank 1 over rank 2, hs 13, docs", 1, 8 * 20, 26, 2, zigzag(1, 4, 20), zigzag(2, 4, 20), true},
};

template <class S>
struct BlockInputs {
  BlockInputs(const Pair& p, std::mt19937_64& rng)
      : q_pos(positions(p.q_pieces)), k_pos(positions(p.k_pieces)), Tq(int(q_pos.size())), Tk(int(k_pos.size())) {
    q = to_storage<S>(mt::testing::random_floats(size_t(p.B) * Tq * 3 * p.C, rng, -2.f, 2.f));  // a (B,Tq,3C) qkv
    kv = to_storage<S>(mt::testing::random_floats(size_t(p.B) * Tk * 2 * p.C, rng, -2.f, 2.f));  // (B,Tk,2C)
    if (p.docs) {
      const std::vector<int32_t> seq = mt::testing::random_doc_ids(p.B, p.T, rng);
      for (int b = 0; b < p.B; b++) {
        for (int32_t t : q_pos) q_doc.push_back(seq[size_t(b) * p.T + t]);
        for (int32_t t : k_pos) k_doc.push_back(p.other_docs ? 1000000 + seq[size_t(b) * p.T + t] : seq[size_t(b) * p.T + t]);
      }
    }
  }
  const int32_t* qd() const { return q_doc.empty() ? nullptr : q_doc.data(); }
  const int32_t* kd() const { return k_doc.empty() ? nullptr : k_doc.data(); }
  std::vector<int32_t> q_pos, k_pos, q_doc, k_doc;
  int Tq, Tk;
  std::vector<S> q, kv;
};

std::string label(const Pair& p) { return std::string(p.what) + " (C=" + std::to_string(p.C) + " NH=" + std::to_string(p.NH) + ")"; }

template <class D, int ND>
void fwd_nd(float* out, float* lse, const D* q, const D* kv, const int32_t* qp, const int32_t* kp, const int32_t* qd,
            const int32_t* kd, int B, int Tq, int Tk, int C, int NH) {
  const int hs = C / NH;
  run(bk::tile_shape(B, Tq, NH, bk::fwd_smem_bytes(hs)), bk::block_fwd_kernel<D, ND>, out, lse, q, 3 * C, kv, kv + C,
      2 * C, qp, kp, qd, kd, Tq, Tk, C, NH, 1.f / std::sqrt(float(hs)));
}

template <class D, int ND>
void bwd_nd(float* dq, float* dk, float* dv, const D* dout, const D* q, const D* kv, const float* lse,
            const float* delta, const int32_t* qp, const int32_t* kp, const int32_t* qd, const int32_t* kd, int B,
            int Tq, int Tk, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.f / std::sqrt(float(hs));
  run(bk::tile_shape(B, Tk, NH, bk::dkdv_smem_bytes(hs)), bk::block_bwd_dkdv_kernel<D, ND>, dk, dv, 2 * C, dout, q,
      3 * C, kv, kv + C, 2 * C, lse, delta, qp, kp, qd, kd, Tq, Tk, C, NH, scale);
  run(bk::tile_shape(B, Tq, NH, bk::dq_smem_bytes(hs)), bk::block_bwd_dq_kernel<D, ND>, dq, dout, q, 3 * C, kv,
      kv + C, 2 * C, lse, delta, qp, kp, qd, kd, Tq, Tk, C, NH, scale);
}

// The launchers' dispatch on the lanes' share of the head dimensions.
#define MT_BY_CHUNKS(hs, call)          \
  switch (fk::head_chunks(hs)) {        \
    case 1: call(1); break;             \
    case 2: call(2); break;             \
    case 3: call(3); break;             \
    default: call(4); break;            \
  }

template <class S>
class FlashBlockEmulated : public EmulatedTest<S> {};
TYPED_TEST_SUITE(FlashBlockEmulated, StorageTypes, StorageNames);

TYPED_TEST(FlashBlockEmulated, ForwardMatchesTheCpuTwin) {
  using S = TypeParam;
  for (const Pair& p : kPairs) {
    SCOPED_TRACE(label(p));
    const BlockInputs<S> in(p, this->rng);
    const size_t nout = size_t(p.B) * in.Tq * p.C, nlse = size_t(p.B) * p.NH * in.Tq;
    std::vector<float> ref(nout), ref_lse(nlse), out = nans<float>(nout), lse = nans<float>(nlse);
    mt::cpu::flash_block_fwd<S>(ref.data(), ref_lse.data(), in.q.data(), 3 * p.C, in.kv.data(), in.kv.data() + p.C,
                                2 * p.C, in.q_pos.data(), in.k_pos.data(), in.qd(), in.kd(), p.B, in.Tq, in.Tk, p.C,
                                p.NH);
#define MT_FWD(ND)                                                                                                 \
  fwd_nd<mt::cuda::dev_t<S>, ND>(out.data(), lse.data(), dev_ptr(in.q.data()), dev_ptr(in.kv.data()),             \
                                 in.q_pos.data(), in.k_pos.data(), in.qd(), in.kd(), p.B, in.Tq, in.Tk, p.C, p.NH)
    MT_BY_CHUNKS(p.C / p.NH, MT_FWD)
#undef MT_FWD
    // Rows that see nothing: -inf on both sides (and an output of 0, compared below).
    int hidden = 0;
    for (size_t i = 0; i < nlse; i++) {
      hidden += ref_lse[i] == -INFINITY;
      EXPECT_EQ(lse[i] == -INFINITY, ref_lse[i] == -INFINITY) << "row " << i;
      if (ref_lse[i] == -INFINITY) lse[i] = ref_lse[i] = 0.f;  // compare the rest
    }
    if (std::string(p.what).find("nothing visible") != std::string::npos || p.other_docs) {
      EXPECT_EQ(size_t(hidden), nlse) << "every query should see nothing";
    }
    EXPECT_LE(max_rel_error(out.data(), ref.data(), nout, 1e-12), tol::kFlashFwd.f32) << "out";
    EXPECT_LE(max_rel_error(lse.data(), ref_lse.data(), nlse, kLseFloor), tol::kFlashLse.f32) << "lse";
    for (float x : out) ASSERT_FALSE(std::isnan(x)) << "an output element was not written, or is NaN";
  }
}

TYPED_TEST(FlashBlockEmulated, BackwardAddsTheCpuTwinsGradients) {
  using S = TypeParam;
  for (const Pair& p : kPairs) {
    SCOPED_TRACE(label(p));
    const BlockInputs<S> in(p, this->rng);
    const size_t nq = size_t(p.B) * in.Tq * p.C, nkv = size_t(p.B) * in.Tk * 2 * p.C, nlse = size_t(p.B) * p.NH * in.Tq;
    // lse from this block's forward (as if it were the final one: P stays a probability), delta any
    // value: the backward's formulas hold for every D.
    std::vector<float> out(nq), lse(nlse);
    mt::cpu::flash_block_fwd<S>(out.data(), lse.data(), in.q.data(), 3 * p.C, in.kv.data(), in.kv.data() + p.C,
                                2 * p.C, in.q_pos.data(), in.k_pos.data(), in.qd(), in.kd(), p.B, in.Tq, in.Tk, p.C,
                                p.NH);
    const std::vector<float> delta = mt::testing::random_floats(nlse, this->rng);
    const std::vector<S> dout = to_storage<S>(mt::testing::random_floats(nq, this->rng));
    // Both sides add to the same nonzero start (dk and dv interleaved in one (B,Tk,2C) buffer).
    const std::vector<float> dq0 = mt::testing::random_floats(nq, this->rng), dkv0 = mt::testing::random_floats(nkv, this->rng);
    std::vector<float> ref_dq = dq0, ref_dkv = dkv0, dq = dq0, dkv = dkv0;
    mt::cpu::flash_block_bwd<S>(ref_dq.data(), ref_dkv.data(), ref_dkv.data() + p.C, 2 * p.C, dout.data(),
                                in.q.data(), 3 * p.C, in.kv.data(), in.kv.data() + p.C, 2 * p.C, lse.data(),
                                delta.data(), in.q_pos.data(), in.k_pos.data(), in.qd(), in.kd(), p.B, in.Tq, in.Tk,
                                p.C, p.NH);
#define MT_BWD(ND)                                                                                                  \
  bwd_nd<mt::cuda::dev_t<S>, ND>(dq.data(), dkv.data(), dkv.data() + p.C, dev_ptr(dout.data()),                    \
                                 dev_ptr(in.q.data()), dev_ptr(in.kv.data()), lse.data(), delta.data(),            \
                                 in.q_pos.data(), in.k_pos.data(), in.qd(), in.kd(), p.B, in.Tq, in.Tk, p.C, p.NH)
    MT_BY_CHUNKS(p.C / p.NH, MT_BWD)
#undef MT_BWD
    // Each gradient's change, against the twin's change (the start cancels out of both).
    auto change = [](const std::vector<float>& after, const std::vector<float>& before) {
      std::vector<float> d(after.size());
      for (size_t i = 0; i < d.size(); i++) d[i] = after[i] - before[i];
      return d;
    };
    const std::vector<float> gq = change(dq, dq0), wq = change(ref_dq, dq0);
    const std::vector<float> gkv = change(dkv, dkv0), wkv = change(ref_dkv, dkv0);
    double largest = 0;
    for (float x : wkv) largest = std::max(largest, double(std::fabs(x)));
    for (float x : wq) largest = std::max(largest, double(std::fabs(x)));
    if (largest == 0) {  // nothing visible: nothing may change
      EXPECT_EQ(dq, dq0);
      EXPECT_EQ(dkv, dkv0);
      continue;
    }
    // The start is of order 1 and the change may be small: measured against the largest change.
    EXPECT_LE(max_rel_error(gq.data(), wq.data(), nq, largest), tol::kFlashBwd.f32) << "dq";
    EXPECT_LE(max_rel_error(gkv.data(), wkv.data(), nkv, largest), tol::kFlashBwd.f32) << "dk, dv";
  }
}

// attention_merge's kernel against the CPU twin: both sides finite, either side -inf, both -inf.
TEST(FlashBlockMergeEmulated, MatchesTheCpuTwin) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const int B = 2, T = 37, C = 48, NH = 3;
  const size_t n = size_t(B) * T * C, nl = size_t(B) * NH * T;
  std::vector<float> out = mt::testing::random_floats(n, rng), part = mt::testing::random_floats(n, rng);
  std::vector<float> lse = mt::testing::random_floats(nl, rng, -3.f, 3.f), plse = mt::testing::random_floats(nl, rng, -3.f, 3.f);
  for (size_t i = 0; i < nl; i += 5) lse[i] = -INFINITY;
  for (size_t i = 0; i < nl; i += 7) plse[i] = -INFINITY;
  std::vector<float> ref = out, ref_lse = lse;
  mt::cpu::attention_merge<float>(ref.data(), ref_lse.data(), part.data(), plse.data(), B, T, C, NH);
  run(bk::merge_shape(int64_t(nl)), bk::merge_kernel, out.data(), lse.data(), static_cast<const float*>(part.data()),
      static_cast<const float*>(plse.data()), B, T, C, NH);
  for (size_t i = 0; i < nl; i++) {
    EXPECT_EQ(lse[i] == -INFINITY, ref_lse[i] == -INFINITY) << i;
    if (ref_lse[i] == -INFINITY) lse[i] = ref_lse[i] = 0.f;
  }
  EXPECT_LE(max_rel_error(out.data(), ref.data(), n), 1e-6);
  EXPECT_LE(max_rel_error(lse.data(), ref_lse.data(), nl), 1e-6);
}

}  // namespace
