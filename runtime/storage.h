// Storage types for activations and compute weights: fp32, bf16 and fp16 values as they sit in memory,
// and the conversions every kernel uses to load them into its accumulation type and store results.
//
// A bf16/f16 tensor holds real 16-bit values on both backends (the CPU backend is the reference for
// the GPU, so it stores exactly what the GPU stores). Arithmetic is never done in 16 bits: a kernel
// loads into acc_t<S> (float, or double for the finite-difference tests), computes, and rounds once
// on store (round to nearest, ties to even; runtime/dtype.h).
#pragma once
#include <cstdint>
#include <type_traits>

#include "runtime/dtype.h"

namespace mt {

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2, "16-bit storage types");

// The type a kernel accumulates in for storage type S.
template <class S>
using acc_t = std::conditional_t<std::is_same_v<S, double>, double, float>;

inline float load(float x) { return x; }
inline double load(double x) { return x; }
inline float load(bf16 x) { return bf16_to_f32(x.bits); }
inline float load(f16 x) { return f16_to_f32(x.bits); }

template <class S>
inline S store_as(acc_t<S> v) {
  if constexpr (std::is_same_v<S, bf16>) {
    return bf16{f32_to_bf16(v)};
  } else if constexpr (std::is_same_v<S, f16>) {
    return f16{f32_to_f16(v)};
  } else {
    return S(v);
  }
}

template <class S>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<S, bf16>) return DType::bf16;
  else if constexpr (std::is_same_v<S, f16>) return DType::f16;
  else return DType::f32;  // float (double only exists in the CPU tests)
}

}  // namespace mt
