// Storage types on the device: the CUDA view of mt::bf16 / mt::f16 (runtime/storage.h), and the loads
// and stores every kernel uses.
//
// mt::bf16 and mt::f16 have the size and bits of __nv_bfloat16 and __half, so a launcher templated on
// the project's storage type S reinterprets its pointers as dev_t<S> and the kernels work on the CUDA
// types. A kernel loads S into fp32 (exact for all three), computes in fp32 and rounds once on store.
// The stores round to nearest, ties to even, bit for bit as runtime/dtype.h does (NaN stays a quiet
// NaN with the CPU's payload, fp16 overflow becomes inf, fp16 subnormals are rounded on the 2^-24
// grid), so both backends store the same bits for the same fp32 value. The CUDA intrinsics
// (__float2bfloat16_rn, __float2half_rn) agree on every finite value but not on NaN payloads.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "runtime/dtype.h"
#include "runtime/storage.h"

namespace mt::cuda {

template <class S>
struct DeviceStorage {
  static_assert(std::is_same_v<S, float>, "storage types are float, mt::bf16 and mt::f16");
  using type = float;
  static constexpr cudaDataType_t cuda_type = CUDA_R_32F;
};
template <>
struct DeviceStorage<bf16> {
  using type = __nv_bfloat16;
  static constexpr cudaDataType_t cuda_type = CUDA_R_16BF;
};
template <>
struct DeviceStorage<f16> {
  using type = __half;
  static constexpr cudaDataType_t cuda_type = CUDA_R_16F;
};
static_assert(sizeof(__nv_bfloat16) == sizeof(bf16) && sizeof(__half) == sizeof(f16), "16-bit storage views");

// The CUDA type a kernel sees for storage type S (float, __nv_bfloat16, __half).
template <class S>
using dev_t = typename DeviceStorage<S>::type;

// The device view of a (possibly const) storage pointer.
template <class S>
inline auto dev_ptr(S* p) {
  using T = dev_t<std::remove_const_t<S>>;
  if constexpr (std::is_const_v<S>) {
    return reinterpret_cast<const T*>(p);
  } else {
    return reinterpret_cast<T*>(p);
  }
}

// cuBLASLt's name for the element type of a storage type.
inline cudaDataType_t cuda_type_of(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// ---- bit-exact twins of runtime/dtype.h ----

__device__ inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__device__ inline float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

__device__ inline uint16_t f32_to_f16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Subnormal or zero: the value times 2^24 (exact, a power-of-two scale) rounded to an integer.
    const float scaled = __uint_as_float(a) * 16777216.0f;
    uint32_t q = uint32_t(scaled);
    const float rem = scaled - float(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
    return uint16_t(sign | q);
  }
  a += 0xfffu + ((a >> 13) & 1u);
  a -= (112u << 23);
  return uint16_t(sign | (a >> 13));
}

__device__ inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float v = float(man) / 16777216.0f;
    return sign ? -v : v;
  }
  if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (man << 13));
  return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// ---- load / store ----

__device__ inline float load(float x) { return x; }
__device__ inline float load(__nv_bfloat16 x) { return bf16_bits_to_f32(__bfloat16_as_ushort(x)); }
__device__ inline float load(__half x) { return f16_bits_to_f32(__half_as_ushort(x)); }

// The value v rounded to storage type D (D = float, __nv_bfloat16 or __half).
template <class D>
__device__ inline D store_as(float v) {
  if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    return __ushort_as_bfloat16(f32_to_bf16_bits(v));
  } else if constexpr (std::is_same_v<D, __half>) {
    return __ushort_as_half(f32_to_f16_bits(v));
  } else {
    static_assert(std::is_same_v<D, float>, "storage types are float, __nv_bfloat16 and __half");
    return v;
  }
}

}  // namespace mt::cuda
