// bf16 / fp16 conversions against an independent reference.
//
// The runtime rounds with bit tricks (adding a rounding bias to the fp32 pattern). The reference
// here works on values instead: a format with p significant bits and minimum normal exponent emin
// holds, near x, exactly the multiples of q = 2^(max(floor(log2 |x|), emin) - p + 1); x / q is exact
// in long double, nearbyintl rounds it to nearest with ties to even (the default rounding mode), and
// a result of 2^(emax+1) or more is an overflow to infinity. Decoding is done with ldexp from the
// sign / exponent / mantissa fields. Everything is compared bit for bit (signed zeros included);
// NaNs only need to stay NaN.
//
// Coverage: all 65536 bit patterns of each format (decode, and encode(decode(h)) == h), every
// midpoint between neighbouring values (the ties) and its float neighbours, two million random
// fp32 bit patterns, and named edge cases (overflow, subnormals, signalling NaNs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <ostream>
#include <string>

#include "runtime/check.h"
#include "runtime/dtype.h"
#include "tests/test_util.h"

namespace mt {
namespace {

struct Format {
  const char* name;
  int precision;  // significant bits, the implicit one included
  int emin;       // exponent of the smallest normal
  int emax;       // exponent of the largest finite
  int exp_bits, man_bits, bias;
};
constexpr Format kBf16{"bf16", 8, -126, 127, 8, 7, 127};
constexpr Format kF16{"f16", 11, -14, 15, 5, 10, 15};

// The value of bit pattern h in format f, from its fields.
double decode_ref(const Format& f, uint16_t h) {
  const int sign = h >> 15;
  const int e = (h >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int man = h & ((1 << f.man_bits) - 1);
  double v;
  if (e == (1 << f.exp_bits) - 1)
    v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0)
    v = std::ldexp(double(man), f.emin - f.man_bits);
  else
    v = std::ldexp(double((1 << f.man_bits) + man), e - f.bias - f.man_bits);
  return sign ? -v : v;
}

// x rounded to the nearest value of format f, ties to even, as a float.
float round_ref(const Format& f, float x) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const int e = std::max(std::ilogb(x), f.emin);
  const long double q = std::ldexp(1.0L, e - f.precision + 1);
  const long double r = std::nearbyintl((long double)x / q) * q;
  if (std::fabs(r) >= std::ldexp(1.0L, f.emax + 1)) return std::copysign(std::numeric_limits<float>::infinity(), x);
  if (r == 0) return std::copysign(0.0f, x);
  return float(r);
}

float to_fmt(const Format& f, float x) { return f.precision == 8 ? round_bf16(x) : round_f16(x); }
uint16_t encode(const Format& f, float x) { return f.precision == 8 ? f32_to_bf16(x) : f32_to_f16(x); }
float decode(const Format& f, uint16_t h) { return f.precision == 8 ? bf16_to_f32(h) : f16_to_f32(h); }

void PrintTo(const Format& f, std::ostream* os) { *os << f.name; }

std::string show(float x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%08x)", double(x), f32_bits(x));
  return buf;
}

// Bitwise equality for numbers, "both NaN" for NaNs.
::testing::AssertionResult same(float got, float want, float input) {
  if (std::isnan(want) ? std::isnan(got) : f32_bits(got) == f32_bits(want)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "input " << show(input) << ": got " << show(got) << ", want " << show(want);
}

class DTypeRounding : public ::testing::TestWithParam<Format> {};

TEST_P(DTypeRounding, EveryBitPatternDecodesExactlyAndRoundTrips) {
  const Format& f = GetParam();
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  for (uint32_t h = 0; h < 65536; h++) {
    const float v = decode(f, uint16_t(h));
    const double want = decode_ref(f, uint16_t(h));
    ASSERT_TRUE(same(v, float(want), v)) << f.name << " pattern " << h;
    if (std::isnan(v)) {
      ASSERT_TRUE(std::isnan(decode(f, encode(f, v)))) << f.name << " NaN pattern " << h;
    } else {
      ASSERT_EQ(encode(f, v), h) << f.name << " pattern " << h;
    }
  }
}

TEST_P(DTypeRounding, MidpointsTieToEvenAndTheirNeighboursRoundToNearest) {
  const Format& f = GetParam();
  const uint16_t max_finite = uint16_t(((1u << f.exp_bits) - 1) << f.man_bits) - 1;
  for (uint32_t sign : {0u, 0x8000u}) {
    for (uint32_t h = 0; h < max_finite; h++) {
      const float a = decode(f, uint16_t(sign | h)), b = decode(f, uint16_t(sign | (h + 1)));
      const float mid = float((double(a) + double(b)) / 2);  // exact: fp32 has spare bits
      ASSERT_EQ(double(mid), (double(a) + double(b)) / 2);
      const float even = (h & 1) ? b : a;
      ASSERT_TRUE(same(to_fmt(f, mid), even, mid)) << f.name;
      ASSERT_TRUE(same(to_fmt(f, mid), round_ref(f, mid), mid)) << f.name;
      const float below = std::nextafter(mid, a), above = std::nextafter(mid, b);
      ASSERT_TRUE(same(to_fmt(f, below), a, below)) << f.name;
      ASSERT_TRUE(same(to_fmt(f, above), b, above)) << f.name;
    }
  }
}

TEST_P(DTypeRounding, RandomFloatsMatchTheReference) {
  const Format& f = GetParam();
  std::mt19937_64 rng(mt::testing::test_seed());
  for (int i = 0; i < 2000000; i++) {
    const float x = f32_from_bits(uint32_t(rng()));
    ASSERT_TRUE(same(to_fmt(f, x), round_ref(f, x), x)) << f.name;
  }
  // Values near the format's own range, where random fp32 patterns are sparse.
  std::uniform_real_distribution<double> logmag(f.emin - f.precision - 2, f.emax + 1.5);
  for (int i = 0; i < 500000; i++) {
    const float x = float(std::exp2(logmag(rng))) * ((rng() & 1) ? -1.f : 1.f);
    ASSERT_TRUE(same(to_fmt(f, x), round_ref(f, x), x)) << f.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, DTypeRounding, ::testing::Values(kBf16, kF16),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(DTypeEdgeCases, F16OverflowSubnormalsAndTies) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_f16(65504.f), 65504.f);                       // largest finite
  EXPECT_EQ(round_f16(std::nextafter(65520.f, 0.f)), 65504.f);  // just below the midpoint to 2^16
  EXPECT_EQ(round_f16(65520.f), inf);                           // the midpoint ties to the even "2^16" = inf
  EXPECT_EQ(round_f16(-1e6f), -inf);
  EXPECT_EQ(round_f16(std::ldexp(1.f, -24)), std::ldexp(1.f, -24));  // smallest subnormal
  EXPECT_EQ(round_f16(std::ldexp(1.f, -25)), 0.f);                   // half of it: tie to even zero
  EXPECT_EQ(round_f16(std::ldexp(3.f, -25)), std::ldexp(2.f, -24));  // 1.5 units: tie to even 2
  EXPECT_EQ(round_f16(std::ldexp(1.f, -14) - std::ldexp(1.f, -25)), std::ldexp(1.f, -14));  // into the normals
  EXPECT_TRUE(std::signbit(round_f16(-1e-30f)));                                            // underflow keeps the sign
  EXPECT_EQ(round_f16(1.f + std::ldexp(1.f, -11)), 1.f);
  EXPECT_EQ(round_f16(1.f + std::ldexp(3.f, -11)), 1.f + std::ldexp(1.f, -9));
  EXPECT_TRUE(std::isnan(round_f16(f32_from_bits(0x7f800001u))));  // signalling NaN must not become inf
  EXPECT_TRUE(std::isnan(round_f16(f32_from_bits(0xffc00000u))));
}

TEST(DTypeEdgeCases, Bf16OverflowSubnormalsAndTies) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_bf16(std::numeric_limits<float>::max()), inf);
  EXPECT_EQ(round_bf16(-std::numeric_limits<float>::max()), -inf);
  EXPECT_EQ(round_bf16(f32_from_bits(0x7f7f7fffu)), f32_from_bits(0x7f7f0000u));  // largest finite bf16
  EXPECT_EQ(round_bf16(1.f + std::ldexp(1.f, -8)), 1.f);
  EXPECT_EQ(round_bf16(1.f + std::ldexp(3.f, -8)), 1.f + std::ldexp(1.f, -6));
  EXPECT_EQ(round_bf16(std::numeric_limits<float>::denorm_min()), 0.f);  // fp32 subnormals round within bf16's grid
  EXPECT_EQ(round_bf16(std::ldexp(1.f, -133)), std::ldexp(1.f, -133));   // smallest bf16 subnormal
  EXPECT_TRUE(std::signbit(round_bf16(-0.f)));
  EXPECT_TRUE(std::isnan(round_bf16(f32_from_bits(0x7f800001u))));  // payload only in the dropped bits
  EXPECT_TRUE(std::isnan(round_bf16(f32_from_bits(0xff800001u))));
}

TEST(DTypeNames, SizesAndNamesRoundTripAndBadNamesNameTheValue) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::u16})
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  try {
    dtype_from_name("fp8");
    FAIL() << "no error for an unknown dtype";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt
