#include "parallel/host_reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace mt::parallel {
namespace {

// Elements are reduced in tiles so the fp32 accumulators stay in L1 while every block is visited in
// order; the order per element is the same as an untiled loop.
constexpr size_t kTile = 1024;

template <DType T>
float widen(const void* p, size_t i) {
  if constexpr (T == DType::f32) return static_cast<const float*>(p)[i];
  if constexpr (T == DType::bf16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  if constexpr (T == DType::f16) return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
}

template <DType T>
void narrow(void* p, size_t i, float v) {
  if constexpr (T == DType::f32) static_cast<float*>(p)[i] = v;
  if constexpr (T == DType::bf16) static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
  if constexpr (T == DType::f16) static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
}

// NaN-propagating max: once the accumulator is NaN it stays NaN, and a NaN input replaces it.
inline float max_nan(float acc, float v) { return (v > acc || v != v) ? v : acc; }

template <DType T>
void reduce_float(void* out, const void* blocks, int n, size_t count, ReduceOp op) {
  const char* base = static_cast<const char*>(blocks);
  const size_t block_bytes = count * dtype_size(T);
  float acc[kTile];
  for (size_t start = 0; start < count; start += kTile) {
    size_t len = std::min(kTile, count - start);
    for (size_t i = 0; i < len; i++) acc[i] = widen<T>(base, start + i);
    for (int k = 1; k < n; k++) {
      const char* blk = base + size_t(k) * block_bytes;
      if (op == ReduceOp::max) {
        for (size_t i = 0; i < len; i++) acc[i] = max_nan(acc[i], widen<T>(blk, start + i));
      } else {
        for (size_t i = 0; i < len; i++) acc[i] += widen<T>(blk, start + i);
      }
    }
    if (op == ReduceOp::avg) {
      float fn = float(n);
      for (size_t i = 0; i < len; i++) acc[i] /= fn;
    }
    for (size_t i = 0; i < len; i++) narrow<T>(out, start + i, acc[i]);
  }
}

void reduce_i32(int32_t* out, const int32_t* blocks, int n, size_t count, ReduceOp op) {
  std::memcpy(out, blocks, count * sizeof(int32_t));
  for (int k = 1; k < n; k++) {
    const int32_t* blk = blocks + size_t(k) * count;
    if (op == ReduceOp::max) {
      for (size_t i = 0; i < count; i++) out[i] = std::max(out[i], blk[i]);
    } else {  // wrap modulo 2^32 (signed overflow is undefined, unsigned is not)
      for (size_t i = 0; i < count; i++) out[i] = int32_t(uint32_t(out[i]) + uint32_t(blk[i]));
    }
  }
}

}  // namespace

void reduce_blocks(void* out, const void* blocks, int n, size_t count, DType t, ReduceOp op) {
  MT_CHECK(n >= 1, "reduce over %d blocks", n);
  switch (t) {
    case DType::f32: reduce_float<DType::f32>(out, blocks, n, count, op); break;
    case DType::bf16: reduce_float<DType::bf16>(out, blocks, n, count, op); break;
    case DType::f16: reduce_float<DType::f16>(out, blocks, n, count, op); break;
    case DType::i32:
      MT_CHECK(op != ReduceOp::avg, "avg is not defined for i32");
      reduce_i32(static_cast<int32_t*>(out), static_cast<const int32_t*>(blocks), n, count, op);
      break;
    default: MT_CHECK(false, "%s cannot be reduced", dtype_name(t));
  }
}

}  // namespace mt::parallel
