// The warp emulator itself (kernels/cuda/warp_emulation.h): what the CUDA kernels rely on when the
// host compiler builds them against it. Thread numbering in 2-D and 3-D blocks, static shared memory
// as one array per block, the warp exchanges (shuffles of 32- and 64-bit values, ballots), the
// block-wide vote, ldmatrix against the PTX ISA's description, cp.async groups under both timings, the
// shared-memory-only addressing of both, and a barrier that not every thread reaches reported as an
// error instead of hanging.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/mma.cuh"

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

// Four 8 x 8 matrices of 16-bit values in dynamic shared memory, element (i, j) of matrix m holding
// 100 m + 10 i + j, rows padded to 24 elements (48 bytes, 16-byte aligned); matrix m starts at row 8 m.
// Lane 8 m + i passes row i of matrix m; every lane stores the four words it receives, plain and
// transposed.
__global__ void ldmatrix_kernel(uint32_t* plain, uint32_t* trans) {
  constexpr int kLd = 24;
  MT_DYNAMIC_SHARED(uint16_t, tile);
  const int lane = int(threadIdx.x);
  for (int m = 0; m < 4; m++)
    for (int e = 0; e < 2; e++) {  // each lane fills two elements of every matrix
      const int i = lane / 4, j = 2 * (lane % 4) + e;
      tile[(8 * m + i) * kLd + j] = uint16_t(100 * m + 10 * i + j);
    }
  __syncwarp();
  const uint16_t* row = tile + (8 * (lane / 8) + lane % 8) * kLd;
  mt::cuda::mma::ldmatrix_x4<false>(plain + 4 * lane, row);
  mt::cuda::mma::ldmatrix_x4<true>(trans + 4 * lane, row);
}

TEST(WarpEmulation, LdmatrixDeliversTheFragmentsOfThePtxIsa) {
  // PTX ISA, ldmatrix: lane 4 g + t receives elements (g, 2t) and (g, 2t + 1) of each matrix, the first
  // in the low half; .trans delivers the transposed matrix, (2t, g) and (2t + 1, g).
  std::vector<uint32_t> plain(128), trans(128);
  launch(dim3(1), dim3(32), 32 * 24 * 2, ldmatrix_kernel, plain.data(), trans.data());
  auto value = [](int m, int i, int j) { return uint32_t(100 * m + 10 * i + j); };
  for (int lane = 0; lane < 32; lane++) {
    const int g = lane / 4, t = lane % 4;
    for (int m = 0; m < 4; m++) {
      EXPECT_EQ(plain[size_t(4 * lane + m)], value(m, g, 2 * t) | value(m, g, 2 * t + 1) << 16) << lane << " " << m;
      EXPECT_EQ(trans[size_t(4 * lane + m)], value(m, 2 * t, g) | value(m, 2 * t + 1, g) << 16) << lane << " " << m;
    }
  }
}

// One thread copies two 16-byte rows in two cp.async groups and records what shared memory holds:
// before any wait, after wait<1> (the first group landed) and after wait<0> (both).
__global__ void async_copy_kernel(int* seen, const int* src) {
  MT_DYNAMIC_SHARED(int, dst);  // 8 ints, all bits set (-1) at the start of the block, as the emulator fills it
  namespace ac = mt::cuda::async_copy;
  if (threadIdx.x != 0) return;
  ac::copy16(dst, src, true);
  ac::commit();
  ac::copy16(dst + 4, src + 4, true);
  ac::commit();
  seen[0] = dst[0], seen[1] = dst[4];
  ac::wait<1>();
  seen[2] = dst[0], seen[3] = dst[4];
  ac::wait<0>();
  seen[4] = dst[0], seen[5] = dst[4];
}

TEST(WarpEmulation, AsyncCopiesLandAtTheirWaitOrAtOnce) {
  alignas(16) const int src[8] = {11, 12, 13, 14, 21, 22, 23, 24};
  std::vector<int> seen(6);
  launch(dim3(1), dim3(32), 32, async_copy_kernel, seen.data(), src);  // late timing, the default
  EXPECT_EQ(seen, (std::vector<int>{-1, -1, 11, -1, 11, 21}));
  const mt::cuda::emu::TimingScope early(mt::cuda::emu::Timing::early);
  launch(dim3(1), dim3(32), 32, async_copy_kernel, seen.data(), src);
  EXPECT_EQ(seen, (std::vector<int>{11, 21, 11, 21, 11, 21}));
}

// ldmatrix and cp.async address shared memory only, and cp.async wants a 16-byte aligned source even
// when it reads nothing (zero fill). what: 0 ldmatrix from global memory, 1 cp.async into global
// memory, 2 a zero-filling cp.async from an unaligned source, 3 both in shared memory (allowed).
__global__ void shared_only_kernel(int what, const uint16_t* global_src, uint16_t* global_dst) {
  MT_DYNAMIC_SHARED(uint16_t, tile);  // 32 rows of 8 values
  uint32_t r[4];
  const int lane = int(threadIdx.x);
  switch (what) {
    case 0: mt::cuda::mma::ldmatrix_x4<false>(r, global_src + 8 * (lane % 8)); break;
    case 1: mt::cuda::async_copy::copy16(global_dst, global_src, true); break;
    case 2: mt::cuda::async_copy::copy16(tile + 8 * lane, global_src + 1, false); break;
    default:
      mt::cuda::async_copy::copy16(tile + 8 * lane, global_src, false);
      mt::cuda::mma::ldmatrix_x4<false>(r, tile + 8 * lane);
  }
  mt::cuda::async_copy::commit();
  mt::cuda::async_copy::wait<0>();
}

TEST(WarpEmulation, SharedMemoryInstructionsRefuseOtherAddresses) {
  alignas(16) uint16_t src[72] = {}, dst[8] = {};
  const size_t smem = 32 * 8 * 2;
  EXPECT_THROW(launch(dim3(1), dim3(32), smem, shared_only_kernel, 0, src, dst), std::logic_error);
  EXPECT_THROW(launch(dim3(1), dim3(32), smem, shared_only_kernel, 1, src, dst), std::logic_error);
  EXPECT_THROW(launch(dim3(1), dim3(32), smem, shared_only_kernel, 2, src, dst), std::logic_error);
  EXPECT_NO_THROW(launch(dim3(1), dim3(32), smem, shared_only_kernel, 3, src, dst));
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

// As on the hardware, a block need not be whole warps (the optimizer's clip coefficient runs on one
// thread): block barriers count the threads there are, and warp-wide operations in the last, partial
// warp are refused, since their full mask names lanes that do not exist.
TEST(WarpEmulation, BlocksMayEndWithAPartialWarpThatRefusesWarpOperations) {
  std::vector<int> out(40), before(1);
  launch(dim3(1), dim3(40), 0, neighbour_kernel, out.data(), before.data());
  for (int t = 0; t < 40; t++) EXPECT_EQ(out[size_t(t)], (t + 1) % 40) << "thread " << t;
  launch(dim3(1), dim3(1), 0, neighbour_kernel, out.data(), before.data());
  EXPECT_EQ(out[0], 0);
  std::vector<double> sums(40);
  std::vector<unsigned> ballots(40);
  std::vector<int> votes(3 * 40);
  try {
    launch(dim3(1), dim3(40), 0, exchange_kernel, sums.data(), ballots.data(), votes.data());
    FAIL() << "a shuffle in a partial warp ran";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("in a partial warp of 8 threads"), std::string::npos) << e.what();
  }
  EXPECT_THROW(launch(dim3(1), dim3(32, 33), 0, neighbour_kernel, out.data(), before.data()), std::invalid_argument);
}

}  // namespace
