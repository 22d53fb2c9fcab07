// The fixed-order host reduction: its order, its fp32 accumulation and its single rounding are the
// contract (parallel/host_reduce.h), so results are compared bitwise (tolerance 0).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "parallel/host_reduce.h"
#include "tests/test_util.h"

namespace mt::parallel {
namespace {

uint16_t to16(float v, DType t) { return t == DType::bf16 ? f32_to_bf16(v) : f32_to_f16(v); }
float from16(uint16_t v, DType t) { return t == DType::bf16 ? bf16_to_f32(v) : f16_to_f32(v); }

// The serial reference: block order, fp32 accumulation, one final rounding.
std::vector<float> reference(const std::vector<float>& blocks, int n, size_t count, ReduceOp op) {
  std::vector<float> out(blocks.begin(), blocks.begin() + long(count));
  for (int k = 1; k < n; k++)
    for (size_t i = 0; i < count; i++) {
      float v = blocks[size_t(k) * count + i];
      out[i] = op == ReduceOp::max ? std::max(out[i], v) : out[i] + v;
    }
  if (op == ReduceOp::avg)
    for (auto& x : out) x /= float(n);
  return out;
}

TEST(HostReduce, F32MatchesTheSerialRankOrderReferenceBitwise) {
  std::mt19937_64 rng(testing::test_seed());
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
    int n = int(rng() % 8) + 1;
    size_t count = 2500 + rng() % 700;  // crosses the 1024-element tiles at an odd size
    std::vector<float> blocks = testing::random_floats(size_t(n) * count, rng, -100.f, 100.f);
    std::vector<float> out(count);
    reduce_blocks(out.data(), blocks.data(), n, count, DType::f32, op);
    std::vector<float> ref = reference(blocks, n, count, op);
    EXPECT_EQ(0, std::memcmp(out.data(), ref.data(), count * 4)) << reduce_op_name(op) << " n=" << n;
  }
}

TEST(HostReduce, Bf16AndF16AreSummedInFp32AndRoundedOnce) {
  std::mt19937_64 rng(testing::test_seed() + 1);
  for (DType t : {DType::bf16, DType::f16}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      int n = int(rng() % 7) + 2;
      size_t count = 1500 + rng() % 100;
      std::vector<float> wide = testing::random_floats(size_t(n) * count, rng, -8.f, 8.f);
      std::vector<uint16_t> blocks(wide.size());
      for (size_t i = 0; i < wide.size(); i++) {
        blocks[i] = to16(wide[i], t);
        wide[i] = from16(blocks[i], t);  // the values the reduction actually sees
      }
      std::vector<uint16_t> out(count);
      reduce_blocks(out.data(), blocks.data(), n, count, t, op);
      std::vector<float> ref = reference(wide, n, count, op);
      for (size_t i = 0; i < count; i++)
        ASSERT_EQ(out[i], to16(ref[i], t)) << dtype_name(t) << " " << reduce_op_name(op) << " at " << i;
    }
  }
}

// 1 + 4 x 2^-9: each 2^-9 is a quarter of bf16's unit in the last place at 1, so rounding after
// every addition would stay at 1; one rounding of the fp32 sum gives exactly 1 + 2^-7.
TEST(HostReduce, Bf16RoundingHappensOnlyAtTheEnd) {
  const float small = std::ldexp(1.f, -9);
  std::vector<uint16_t> blocks = {f32_to_bf16(1.f), f32_to_bf16(small), f32_to_bf16(small), f32_to_bf16(small),
                                  f32_to_bf16(small)};
  uint16_t out = 0;
  reduce_blocks(&out, blocks.data(), 5, 1, DType::bf16, ReduceOp::sum);
  EXPECT_EQ(bf16_to_f32(out), 1.f + std::ldexp(1.f, -7));
}

TEST(HostReduce, MaxPropagatesNaNFromAnyBlock) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int where = 0; where < 3; where++) {
    std::vector<float> blocks = {1.f, 2.f, 3.f};
    blocks[size_t(where)] = nan;
    float out = 0;
    reduce_blocks(&out, blocks.data(), 3, 1, DType::f32, ReduceOp::max);
    EXPECT_TRUE(std::isnan(out)) << "NaN in block " << where;
  }
}

TEST(HostReduce, I32SumWrapsAndMaxIsExact) {
  std::mt19937_64 rng(testing::test_seed() + 2);
  const int n = 5;
  const size_t count = 300;
  std::vector<int32_t> blocks(size_t(n) * count);
  for (auto& x : blocks) x = int32_t(uint32_t(rng()));
  std::vector<int32_t> sum(count), mx(count);
  reduce_blocks(sum.data(), blocks.data(), n, count, DType::i32, ReduceOp::sum);
  reduce_blocks(mx.data(), blocks.data(), n, count, DType::i32, ReduceOp::max);
  for (size_t i = 0; i < count; i++) {
    uint32_t s = 0;
    int32_t m = blocks[i];
    for (int k = 0; k < n; k++) {
      s += uint32_t(blocks[size_t(k) * count + i]);
      m = std::max(m, blocks[size_t(k) * count + i]);
    }
    ASSERT_EQ(sum[i], int32_t(s));
    ASSERT_EQ(mx[i], m);
  }
}

TEST(HostReduce, RejectsTypesAndOpsWithoutAMeaning) {
  uint16_t u[2] = {1, 2}, uo = 0;
  int32_t i[2] = {1, 2}, io = 0;
  EXPECT_THROW(reduce_blocks(&uo, u, 2, 1, DType::u16, ReduceOp::sum), Error);
  EXPECT_THROW(reduce_blocks(&io, i, 2, 1, DType::i32, ReduceOp::avg), Error);
}

}  // namespace
}  // namespace mt::parallel
