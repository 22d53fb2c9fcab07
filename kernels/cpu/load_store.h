// Moving values between a storage type S and its accumulation type A = acc_t<S> (internal to
// kernels/cpu; the conversions themselves are in runtime/storage.h).
//
// Every kernel is written once for all storage types. For S = float and S = double, S is its own
// accumulation type (kWide<S>), loads and stores are the identity, and kernels work on the caller's
// buffers in place, exactly as they did before 16-bit storage existed (same loops, same bits). For
// bf16 and f16 a kernel loads its inputs into fp32 scratch, runs the same fp32 code on it and rounds
// the result once, on store.
#pragma once
#include <cstdint>
#include <type_traits>

#include "runtime/storage.h"

namespace mt::cpu {

template <class S>
inline constexpr bool kWide = std::is_same_v<S, acc_t<S>>;

// dst[i] = load(src[i]) for i < n.
template <class S>
inline void load_n(acc_t<S>* dst, const S* src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = load(src[i]);
}

// dst[i] = src[i] rounded to S, for i < n.
template <class S>
inline void store_n(S* dst, const acc_t<S>* src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = store_as<S>(src[i]);
}

// The n values at src as an A array: src itself when S is wide, else a copy loaded into buf.
template <class S>
inline const acc_t<S>* loaded(const S* src, acc_t<S>* buf, int64_t n) {
  if constexpr (kWide<S>) {
    (void)buf;
    (void)n;
    return src;
  } else {
    load_n(buf, src, n);
    return buf;
  }
}

// v as a store followed by a load sees it: rounded to S, back in A.
template <class S>
inline acc_t<S> rounded(acc_t<S> v) {
  return load(store_as<S>(v));
}

// A (rows, cols) block with row stride ld, loaded into a dense (rows, cols) array (and back).
template <class S>
inline void load_rows(acc_t<S>* dst, const S* src, int64_t ld, int rows, int cols) {
  for (int r = 0; r < rows; r++) load_n(dst + int64_t(r) * cols, src + int64_t(r) * ld, cols);
}
template <class S>
inline void store_rows(S* dst, int64_t ld, const acc_t<S>* src, int rows, int cols) {
  for (int r = 0; r < rows; r++) store_n(dst + int64_t(r) * ld, src + int64_t(r) * cols, cols);
}

}  // namespace mt::cpu
