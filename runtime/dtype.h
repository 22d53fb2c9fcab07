// Element types and the round-to-nearest-even conversions between fp32 and bf16/fp16.
//
// Both backends store bf16/fp16 activations as real 16-bit values (runtime/storage.h) converted with
// these functions, so both see the same rounded numbers. NaN stays NaN; fp16 overflow becomes +-inf,
// as on GPU.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace mt {

enum class DType : uint8_t { f32, bf16, f16, i32, u16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType dtype_from_name(const std::string& s);  // throws mt::Error naming the bad value

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// fp32 -> bf16, round to nearest, ties to even.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return uint16_t(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// fp32 -> IEEE binary16, round to nearest, ties to even; handles subnormals, overflow to inf, NaN.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);
inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

}  // namespace mt
