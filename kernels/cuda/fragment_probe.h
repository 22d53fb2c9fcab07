// The tensor-core fragment probe (fragment_probe_kernels.cuh): its sizes, its inputs, the answers the
// PTX ISA's fragment tables give, and the GPU entry point (fragment_probe.cu). Plain C++ (no CUDA
// headers), like cuda_ops.h, so that the selftest and the emulator test share the expectations.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/dtype.h"

namespace mt::cuda::fragment_probe {

constexpr int kN = 16;           // A and B are 16 x 16, row-major in global memory
constexpr int kLd = 24;          // tile row stride (elements): 48 bytes, rows 16-byte aligned
constexpr int kTile = kN * kLd;  // elements per shared tile
constexpr int kLanes = 32;
constexpr int kRegsPerLane = 8;  // the four B registers of load_b2_nmajor, then of load_b2_kmajor
constexpr int kCopyWords = 4;    // 16 bytes copied per lane
constexpr size_t kSmemBytes = 3 * kTile * 2 + kLanes * kCopyWords * 4;

// Integers in [-6, 6] and [-5, 5]: exact in bf16 and fp16, products and 16-term sums exact in fp32.
inline std::vector<float> input_a() {
  std::vector<float> v(kN * kN);
  for (int i = 0; i < kN * kN; i++) v[size_t(i)] = float((i * 7) % 13 - 6);
  return v;
}
inline std::vector<float> input_b() {
  std::vector<float> v(kN * kN);
  for (int i = 0; i < kN * kN; i++) v[size_t(i)] = float((i * 5) % 11 - 5);
  return v;
}

// What the probe produced, next to what it must produce.
struct Result {
  std::vector<float> c_nmajor, c_kmajor, c_want;           // A B, 16 x 16 row-major
  std::vector<uint32_t> regs, regs_want, copied, copied_want;  // per lane
};

// The answers, from A's and B's 16-bit patterns (row-major):
//  - C = A B (exact);
//  - PTX ISA, mma.m16n8k16 B fragment: lane (g, t) holds b0 = (B[2t][g], B[2t+1][g]) and b1 =
//    (B[2t+8][g], B[2t+9][g]), lower row in the low half; the loaders deliver the n8 tiles at columns
//    0 and 8 as registers (0, 1) and (2, 3), both loaders the same words;
//  - cp.async: even lanes bring A's bytes 16 lane .. 16 lane + 15, odd lanes (src-size 0) zeros.
inline Result expectations(const std::vector<uint16_t>& a_bits, const std::vector<uint16_t>& b_bits) {
  Result r;
  const std::vector<float> a = input_a(), b = input_b();
  r.c_want.assign(kN * kN, 0.f);
  for (int i = 0; i < kN; i++)
    for (int n = 0; n < kN; n++)
      for (int k = 0; k < kN; k++) r.c_want[size_t(i * kN + n)] += a[size_t(i * kN + k)] * b[size_t(k * kN + n)];
  r.regs_want.assign(kLanes * kRegsPerLane, 0u);
  auto at = [&](int k, int n) { return uint32_t(b_bits[size_t(k * kN + n)]); };
  for (int lane = 0; lane < kLanes; lane++) {
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
      const int n = 8 * (i / 2) + g, k = 2 * t + 8 * (i % 2);
      const uint32_t word = at(k, n) | at(k + 1, n) << 16;
      r.regs_want[size_t(lane * kRegsPerLane + i)] = word;
      r.regs_want[size_t(lane * kRegsPerLane + 4 + i)] = word;
    }
  }
  r.copied_want.assign(kLanes * kCopyWords, 0u);
  for (int lane = 0; lane < kLanes; lane += 2)
    std::memcpy(&r.copied_want[size_t(lane * kCopyWords)], &a_bits[size_t(8 * lane)], 16);
  return r;
}

// 16-bit patterns of a vector of bf16 or f16 values.
template <class S>
std::vector<uint16_t> bit_patterns(const std::vector<S>& v) {
  static_assert(sizeof(S) == 2, "16-bit values");
  std::vector<uint16_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 2);
  return out;
}

// On the current device: whether it has the instructions (compute capability 8.0 or later), and one
// run in bf16 or f16.
bool supported();
Result run(DType t);

}  // namespace mt::cuda::fragment_probe
