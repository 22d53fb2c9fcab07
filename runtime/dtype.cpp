#include "runtime/dtype.h"

#include "runtime/check.h"

namespace mt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::u16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::u16: return "u16";
  }
  return "?";
}

DType dtype_from_name(const std::string& s) {
  if (s == "f32" || s == "fp32" || s == "F32") return DType::f32;
  if (s == "bf16" || s == "BF16") return DType::bf16;
  if (s == "f16" || s == "fp16" || s == "F16") return DType::f16;
  if (s == "i32" || s == "I32") return DType::i32;
  if (s == "u16" || s == "U16") return DType::u16;
  fail("unknown dtype '%s' (expected f32, bf16, f16, i32 or u16)", s.c_str());
}

uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);         // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);        // rounds to >= 65520 -> inf
  if (a < 0x38800000u) {                                        // result is subnormal or zero
    // value = a as float; f16 subnormal unit is 2^-24. Scale and round to nearest even.
    float v = f32_from_bits(a);
    // v * 2^24, rounded to nearest even integer (exact in fp32 since v < 2^-14)
    float scaled = v * 16777216.0f;
    uint32_t q = uint32_t(scaled);
    float rem = scaled - float(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
    return uint16_t(sign | q);
  }
  // normal: rebias exponent 127 -> 15 and round the 13 dropped mantissa bits
  uint32_t lsb = (a >> 13) & 1u;
  a += 0xfffu + lsb;
  a -= (112u << 23);
  return uint16_t(sign | (a >> 13));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    float v = float(man) / 16777216.0f;  // man * 2^-24
    return (sign ? -v : v);
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13));
  return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

}  // namespace mt
