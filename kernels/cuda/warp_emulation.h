// A host emulator for warp-level CUDA kernels, for checking them on machines without a GPU.
//
// A kernel header that builds with nvcc for the device also builds with the host compiler against this
// file (flash_attention_mma_kernels.cuh does): `launch` runs each thread of a block as a host thread,
// blocks one after another, with
//   - threadIdx, blockIdx, blockDim, gridDim per thread;
//   - __syncthreads as a barrier over the block's threads;
//   - __shfl_xor_sync and mma.sync (m16n8k16, bf16/fp16 in, fp32 accumulate) as exchanges among the
//     32 threads of a warp, following the fragment layouts of the PTX ISA (kernels/cuda/mma.cuh);
//   - dynamic shared memory as one buffer per block.
// Every warp-level call must be reached by all 32 threads of the warp, as on the hardware (the
// emulator deadlocks otherwise). What it cannot show: timing, races the hardware would expose
// (threads run truly in parallel here too, but with a different schedule), the tensor cores' own
// summation order, and the hardware's approximate exp2f/log2f. A kernel that passes here can still
// fail on a GPU, but one that fails here is wrong.
#pragma once
#if defined(__CUDACC__)
#error "warp_emulation.h is for host compilers; nvcc builds the real kernels"
#endif
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

namespace mt::cuda::emu {

constexpr int kLanes = 32;

// What the 32 threads of a warp exchange.
struct Warp {
  std::barrier<> sync{kLanes};
  uint32_t a[kLanes][4], b[kLanes][2], word[kLanes];
};

struct Block {
  Block(int threads, size_t smem_bytes) : sync(threads), warps(size_t(threads / kLanes)), smem((smem_bytes + 15) / 16) {}
  std::barrier<> sync;
  std::deque<Warp> warps;  // barriers do not move
  std::vector<uint4> smem;
};

// The registers a CUDA thread reads its coordinates from, for the host thread that runs it.
struct ThreadState {
  uint3 thread_idx{}, block_idx{};
  dim3 block_dim, grid_dim;
  Block* block = nullptr;
};
inline thread_local ThreadState self;

inline int lane() { return int(self.thread_idx.x) % kLanes; }
inline Warp& warp() { return self.block->warps[self.thread_idx.x / kLanes]; }

template <class T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(self.block->smem.data());
}

template <class T>
T shfl_xor(T v, int mask) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  Warp& w = warp();
  const int l = lane();
  std::memcpy(&w.word[l], &v, 4);
  w.sync.arrive_and_wait();
  T r;
  std::memcpy(&r, &w.word[l ^ mask], 4);
  w.sync.arrive_and_wait();  // every lane has read before the next exchange writes
  return r;
}

inline float half_bits_to_float(uint32_t h, bool bf16) {
  if (bf16) {
    const uint32_t u = h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  return __half2float(__ushort_as_half(uint16_t(h)));
}

// Element (row, k) of the warp's A (16 x 16) and (k, col) of its B (16 x 8), from the lanes holding them.
inline float frag_a(const Warp& w, int row, int k, bool bf16) {
  const int owner = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
  return half_bits_to_float((w.a[owner][reg] >> (16 * (k & 1))) & 0xffffu, bf16);
}
inline float frag_b(const Warp& w, int k, int col, bool bf16) {
  const int owner = col * 4 + (k % 8) / 2, reg = k >= 8 ? 1 : 0;
  return half_bits_to_float((w.b[owner][reg] >> (16 * (k & 1))) & 0xffffu, bf16);
}

// c += a b (m16n8k16) for the calling lane's accumulator fragment.
inline void mma_m16n8k16(float c[4], const uint32_t a[4], const uint32_t b[2], bool bf16) {
  Warp& w = warp();
  const int l = lane(), g = l / 4, t = l % 4;
  std::memcpy(w.a[l], a, sizeof(w.a[l]));
  std::memcpy(w.b[l], b, sizeof(w.b[l]));
  w.sync.arrive_and_wait();
  for (int e = 0; e < 4; e++) {
    const int row = g + 8 * (e / 2), col = 2 * t + (e % 2);
    float acc = c[e];
    for (int k = 0; k < 16; k++) acc += frag_a(w, row, k, bf16) * frag_b(w, k, col, bf16);  // products exact in fp32
    c[e] = acc;
  }
  w.sync.arrive_and_wait();
}

// Runs kernel(args...) over the grid, one host thread per CUDA thread, one block at a time.
template <class Kernel, class... Args>
void launch(dim3 grid, int threads, size_t smem_bytes, Kernel kernel, Args... args) {
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        Block block(threads, smem_bytes);
        std::vector<std::thread> pool;
        pool.reserve(size_t(threads));
        for (int i = 0; i < threads; i++)
          pool.emplace_back([&, i] {
            self = ThreadState{uint3{unsigned(i), 0, 0}, uint3{x, y, z}, dim3(unsigned(threads)), grid, &block};
            kernel(args...);
          });
        for (auto& th : pool) th.join();
      }
}

}  // namespace mt::cuda::emu

// The CUDA names the kernels use, for the host build.
#define threadIdx (::mt::cuda::emu::self.thread_idx)
#define blockIdx (::mt::cuda::emu::self.block_idx)
#define blockDim (::mt::cuda::emu::self.block_dim)
#define gridDim (::mt::cuda::emu::self.grid_dim)
#define __launch_bounds__(...)
inline void __syncthreads() { ::mt::cuda::emu::self.block->sync.arrive_and_wait(); }
template <class T>
T __shfl_xor_sync(unsigned, T v, int mask) {
  return ::mt::cuda::emu::shfl_xor(v, mask);
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
using std::max;
using std::min;
