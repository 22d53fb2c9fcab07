// The warp emulator itself (kernels/cuda/warp_emulation.h): what the CUDA kernels rely on when the
// host compiler builds them against it. Thread numbering in 2-D and 3-D blocks, static shared memory
// as one array per block, the warp exchanges (shuffles of 32- and 64-bit values, ballots), the
// block-wide vote, and a barrier that not every thread reaches reported as an error instead of hanging.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace {

using mt::cuda::emu::launch;

// Each thread writes its linear index, then reads its neighbour's across a barrier; out also gets
// what the array held before anyone wrote it in this block.
__global__ void neighbour_kernel(int* out, int* before) {
  MT_SHARED(int[128], slot);
  const int n = int(blockDim.x), t = int(threadIdx.x), b = int(blockIdx.x);
  if (t == 0) before[b] = slot[0];
  __syncthreads();
  slot[t] = 1000 * b + t;
  __syncthreads();
  out[b * n + t] = slot[(t + 1) % n];
}

TEST(WarpEmulation, StaticSharedMemoryIsOneFreshArrayPerBlock) {
  std::vector<int> out(3 * 128), before(3, 0);
  launch(dim3(3), dim3(128), 0, neighbour_kernel, out.data(), before.data());
  for (int b = 0; b < 3; b++) {
    EXPECT_EQ(before[size_t(b)], -1) << "block " << b << " starts from the 0xff fill, not the last block's values";
    for (int t = 0; t < 128; t++) ASSERT_EQ(out[size_t(b * 128 + t)], 1000 * b + (t + 1) % 128) << b << " " << t;
  }
}

__global__ void coordinates_kernel(int* out, int* partner) {
  const int t = int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  out[t] = int(threadIdx.x) + 100 * int(threadIdx.y) + 10000 * int(threadIdx.z);
  partner[t] = __shfl_xor_sync(0xffffffffu, t, 5);
}

TEST(WarpEmulation, BlocksNumberThreadsXFirstAndWarpsByLinearIndex) {
  const dim3 block(8, 4, 3);  // 96 threads: three warps of four (x, y) rows each
  std::vector<int> out(96), partner(96);
  launch(dim3(1), block, 0, coordinates_kernel, out.data(), partner.data());
  for (int t = 0; t < 96; t++) {
    EXPECT_EQ(out[size_t(t)], t % 8 + 100 * (t / 8 % 4) + 10000 * (t / 32));
    EXPECT_EQ(partner[size_t(t)], t ^ 5);  // lanes pair within the warp of 32 consecutive threads
  }
}

__global__ void exchange_kernel(double* sums, unsigned* ballots, int* votes) {
  const int t = int(threadIdx.x);
  double v = 1.0 + t * 1e-10;  // needs all 64 bits
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  sums[t] = v;
  ballots[t] = __ballot_sync(0xffffffffu, t % 3 == 0);
  votes[3 * t] = __syncthreads_or(t == 77);
  votes[3 * t + 1] = __syncthreads_or(0);
  votes[3 * t + 2] = __syncthreads_or(t == 0) + __popc(ballots[t]);
}

TEST(WarpEmulation, ShufflesBallotsAndVotesSeeTheWholeWarpOrBlock) {
  std::vector<double> sums(128);
  std::vector<unsigned> ballots(128);
  std::vector<int> votes(3 * 128);
  launch(dim3(1), dim3(128), 0, exchange_kernel, sums.data(), ballots.data(), votes.data());
  for (int t = 0; t < 128; t++) {
    const int w0 = t / 32 * 32;
    double want = 0.0;
    for (int l = 0; l < 32; l++) want += 1.0 + (w0 + l) * 1e-10;
    EXPECT_NEAR(sums[size_t(t)], want, 1e-12) << t;
    unsigned bits = 0;
    for (int l = 0; l < 32; l++) bits |= unsigned((w0 + l) % 3 == 0) << l;
    EXPECT_EQ(ballots[size_t(t)], bits) << t;
    EXPECT_EQ(votes[size_t(3 * t)], 1) << t;
    EXPECT_EQ(votes[size_t(3 * t + 1)], 0) << t;
    EXPECT_EQ(votes[size_t(3 * t + 2)], 1 + __builtin_popcount(bits)) << t;
  }
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 32) __syncthreads();
  out[threadIdx.x] = 1;
}

TEST(WarpEmulation, ABarrierSomeThreadsNeverReachIsReported) {
  std::vector<int> out(64);
  try {
    launch(dim3(2), dim3(64), 0, divergent_barrier_kernel, out.data());
    FAIL() << "the launch returned";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("block (0, 0, 0) deadlocked: 32 of 64 threads"), std::string::npos)
        << e.what();
  }
}

TEST(WarpEmulation, BlocksOfWholeWarpsOnly) {
  std::vector<int> out(64);
  EXPECT_THROW(launch(dim3(1), dim3(33), 0, divergent_barrier_kernel, out.data()), std::invalid_argument);
  EXPECT_THROW(launch(dim3(1), dim3(32, 33), 0, divergent_barrier_kernel, out.data()), std::invalid_argument);
}

}  // namespace
