// Warp-level tensor-core tiles: mma.sync.m16n8k16 with 16-bit operands (bf16 or fp16) and fp32
// accumulators (sm_80 and later), and the fragment loads the flash kernels build on.
//
// One instruction computes C (16 x 8) += A (16 x 16) B (16 x 8) for a whole warp. With g = lane / 4
// and t = lane % 4 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), a lane
// holds
//   A: a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B: b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   C: c[0], c[1] = C[g][2t, 2t+1]    c[2], c[3] = C[g+8][2t, 2t+1]
// where each a/b register packs two 16-bit values, the lower index in the low half. So the four lanes
// of a quad (same g) share the rows g and g + 8 of C, and two neighbouring C tiles (columns n0 .. n0+15)
// are, once rounded to 16 bits, exactly the A fragment of the next product over those 16 columns
// (a_from_acc): flash attention keeps P in registers between S = Q K^T and O += P V.
//
// The loads read shared-memory tiles of 16-bit values with a row stride ld (elements). A is read as
// 32-bit pairs (once per block, outside the hot loops); the B fragments of the hot loops come two n8
// tiles at a time from one ldmatrix.x4, plain for a B stored "n-major" (element (k, n) at n * ld + k,
// K when computing Q K^T) and transposed for a B stored "k-major" (element (k, n) at k * ld + n, V
// when computing P V). Against 32-bit pair loads (n-major) and 16-bit gathers (k-major) that is 4
// and 8 times fewer shared-memory instructions, and half the shared-memory wavefronts for k-major.
#pragma once
#if !defined(__CUDACC__)
#include "kernels/cuda/warp_emulation.h"  // host build: emulated warps
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace mt::cuda::mma {

template <class D>
inline constexpr bool kIs16Bit = std::is_same_v<D, __nv_bfloat16> || std::is_same_v<D, __half>;

struct Lane {
  int g, t;  // group (row) and thread-in-group (column pair) of the fragment layouts above
  __device__ explicit Lane(int lane) : g(lane >> 2), t(lane & 3) {}
};

__device__ inline uint32_t bits16(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ inline uint32_t bits16(__half x) { return __half_as_ushort(x); }

__device__ inline uint32_t pack_bits(uint32_t lo, uint32_t hi) { return lo | (hi << 16); }

// Two fp32 values rounded to D (to nearest even, the hardware conversion) in one register.
template <class D>
__device__ inline uint32_t pack(float lo, float hi) {
  if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    return pack_bits(bits16(__float2bfloat16_rn(lo)), bits16(__float2bfloat16_rn(hi)));
  } else {
    static_assert(std::is_same_v<D, __half>, "mma tiles take bf16 or fp16 operands");
    return pack_bits(bits16(__float2half_rn(lo)), bits16(__float2half_rn(hi)));
  }
}

template <class D>
__device__ inline uint32_t load_pair(const D* p) {
  return *reinterpret_cast<const uint32_t*>(p);  // p is 4-byte aligned: even ld and even column
}

// c += a b for one m16n8k16 tile.
template <class D>
__device__ inline void mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  static_assert(kIs16Bit<D>, "mma tiles take bf16 or fp16 operands");
#if !defined(__CUDACC__)
  emu::mma_m16n8k16(c, a, b, std::is_same_v<D, __nv_bfloat16>);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  __trap();  // the launchers never run these kernels below compute capability 8.0
#endif
}

// A rows r0 .. r0+15, columns k0 .. k0+15 of a row-major tile.
template <class D>
__device__ inline void load_a(uint32_t a[4], const D* tile, int ld, int r0, int k0, Lane l) {
  const D* p = tile + (r0 + l.g) * ld + k0 + 2 * l.t;
  a[0] = load_pair(p);
  a[1] = load_pair(p + 8 * ld);
  a[2] = load_pair(p + 8);
  a[3] = load_pair(p + 8 * ld + 8);
}

// ldmatrix.x4: four 8 x 8 matrices of 16-bit values from shared memory in one warp instruction (sm_75
// and later). Lane 8 m + i passes the address of row i of matrix m (16-byte aligned); lane (g, t)
// receives in r[m] the elements (g, 2t), (g, 2t + 1) of matrix m, or with Trans (2t, g), (2t + 1, g).
template <bool Trans, class D>
__device__ inline void ldmatrix_x4(uint32_t r[4], const D* row) {
#if !defined(__CUDACC__)
  emu::ldmatrix_x4(r, row, Trans);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned addr = unsigned(__cvta_generic_to_shared(row));
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
  }
#else
  __trap();  // the launchers never run these kernels below compute capability 8.0
#endif
}

// The B fragments of two neighbouring n8 tiles, columns n0 .. n0+15 over k0 .. k0+15, in one ldmatrix:
// b[0], b[1] for the tile at n0 and b[2], b[3] for the tile at n0 + 8. The tile holds element (k, n) at
// n * ld + k ("n-major", e.g. K in Q K^T): the four 8 x 8 matrices are (n0, k0), (n0, k0+8), (n0+8, k0)
// and (n0+8, k0+8) as (row, column) corners, read as they lie. ld (elements) must keep rows 16-byte
// aligned.
template <class D>
__device__ inline void load_b2_nmajor(uint32_t b[4], const D* tile, int ld, int n0, int k0, Lane l) {
  const int lane = 4 * l.g + l.t, m = lane / 8, i = lane % 8;
  ldmatrix_x4<false>(b, tile + (n0 + i + (m >> 1) * 8) * ld + k0 + (m & 1) * 8);
}

// The same fragments from a tile holding element (k, n) at k * ld + n ("k-major", e.g. V in P V): the
// matrices (k0, n0), (k0+8, n0), (k0, n0+8), (k0+8, n0+8), transposed on the way in.
template <class D>
__device__ inline void load_b2_kmajor(uint32_t b[4], const D* tile, int ld, int n0, int k0, Lane l) {
  const int lane = 4 * l.g + l.t, m = lane / 8, i = lane % 8;
  ldmatrix_x4<true>(b, tile + (k0 + i + (m & 1) * 8) * ld + n0 + (m >> 1) * 8);
}

// The A fragment over columns 16j .. 16j+15 of a row of C tiles (c[2j] covers columns 16j .. 16j+7,
// c[2j+1] the next 8), rounded to D.
template <class D>
__device__ inline void a_from_acc(uint32_t a[4], const float c_lo[4], const float c_hi[4]) {
  a[0] = pack<D>(c_lo[0], c_lo[1]);
  a[1] = pack<D>(c_lo[2], c_lo[3]);
  a[2] = pack<D>(c_hi[0], c_hi[1]);
  a[3] = pack<D>(c_hi[2], c_hi[3]);
}

}  // namespace mt::cuda::mma
