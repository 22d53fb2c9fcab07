// A one-warp probe of the tensor-core building blocks under the flash kernels (mma.cuh,
// async_copy.cuh): load_a, load_b2_nmajor and load_b2_kmajor (ldmatrix.x4, plain and transposed),
// mma.sync m16n8k16 into fp32, and cp.async with its zero fill. The inputs are small integers, so every
// product and sum is exact and each output has exactly one right bit pattern: the one the PTX ISA's
// fragment tables give (fragment_probe.h: expectations, written from those tables and not from
// mma.cuh's loaders).
//
// The warp emulator's model of these instructions is what the flash kernels' tests rest on; this probe
// checks the same model against the hardware. tests/test_emu_fragment_probe.cpp runs it on the
// emulator, `minitrain selftest` on the GPU (fragment_probe.cu), before the flash checks: a layout the
// hardware disagrees with is named there, instead of surfacing as a wrong attention output.
#pragma once
#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fragment_probe.h"
#include "kernels/cuda/mma.cuh"

namespace mt::cuda::fragment_probe {

// One warp. A (16 x 16) goes to a row-major tile; B (16 x 16, element (k, n) at k 16 + n) to an
// n-major tile (element (k, n) at n kLd + k) and a k-major one (at k kLd + n). Outputs:
//   c_nmajor, c_kmajor  16 x 16 row-major: A B, with B's fragments from the n-major / k-major tile
//   regs                per lane, the B registers each loader delivered (kRegsPerLane words)
//   copied              per lane, the 16 bytes cp.async brought from a + 8 lane (odd lanes: zero fill)
template <class D>
__global__ void probe_kernel(const D* a, const D* b, float* c_nmajor, float* c_kmajor, uint32_t* regs,
                             uint32_t* copied) {
  MT_DYNAMIC_SHARED(uint4, smem_raw);
  D* ta = reinterpret_cast<D*>(smem_raw);
  D* tn = ta + kTile;
  D* tk = tn + kTile;
  uint32_t* landed = reinterpret_cast<uint32_t*>(tk + kTile);
  const int lane = int(threadIdx.x);
  for (int i = lane; i < kN * kN; i += kLanes) {
    const int r = i / kN, c = i % kN;
    ta[r * kLd + c] = a[i];
    tk[r * kLd + c] = b[i];
    tn[c * kLd + r] = b[i];
  }
  __syncthreads();

  const mma::Lane l(lane);
  uint32_t fa[4], bn[4], bk[4];
  mma::load_a(fa, ta, kLd, 0, 0, l);
  mma::load_b2_nmajor(bn, tn, kLd, 0, 0, l);
  mma::load_b2_kmajor(bk, tk, kLd, 0, 0, l);
  for (int i = 0; i < 4; i++) {
    regs[lane * kRegsPerLane + i] = bn[i];
    regs[lane * kRegsPerLane + 4 + i] = bk[i];
  }
  for (int h = 0; h < 2; h++) {  // the n8 tile at columns 8 h
    float cn[4] = {0.f, 0.f, 0.f, 0.f}, ck[4] = {0.f, 0.f, 0.f, 0.f};
    mma::mma<D>(cn, fa, bn + 2 * h);
    mma::mma<D>(ck, fa, bk + 2 * h);
    for (int e = 0; e < 4; e++) {  // C fragment: c[e] = C[g + 8 (e / 2)][2 t + e % 2]
      const int at = (l.g + 8 * (e / 2)) * kN + 8 * h + 2 * l.t + e % 2;
      c_nmajor[at] = cn[e];
      c_kmajor[at] = ck[e];
    }
  }

  async_copy::copy16(landed + kCopyWords * lane, a + 8 * lane, lane % 2 == 0);
  async_copy::commit();
  async_copy::wait<0>();
  __syncthreads();
  for (int i = 0; i < kCopyWords; i++) copied[lane * kCopyWords + i] = landed[lane * kCopyWords + i];
}

}  // namespace mt::cuda::fragment_probe
