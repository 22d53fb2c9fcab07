// NcclComm on one GPU (a one-rank NCCL communicator bootstrapped over SelfComm): every op runs
// through NCCL and the stream/event ordering, with one-rank semantics (identities and copies).
// Self-skips without NCCL in the build or without a CUDA device. Multi-GPU behaviour needs
// mpirun on a multi-GPU node and is not covered here.
#include <gtest/gtest.h>

#ifdef MT_HAVE_NCCL
#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <vector>

#include "parallel/nccl_comm.h"
#include "parallel/self_comm.h"
#include "tests/test_util.h"

namespace mt::parallel {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A device copy of host floats, freed at scope exit.
struct DeviceFloats {
  explicit DeviceFloats(const std::vector<float>& h) : n(h.size()) {
    EXPECT_EQ(cudaMalloc(&p, n * 4), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(p); }
  std::vector<float> host(cudaStream_t s) const {
    std::vector<float> h(n);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  float* p = nullptr;
  size_t n;
};

TEST(NcclComm, OneRankCollectivesAreIdentitiesOrCopiesOnTheDevice) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(testing::test_seed());
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreate(&compute), cudaSuccess);
  {
    SelfComm boot("boot");
    NcclComm c(boot, compute, "nccl");
    EXPECT_EQ(c.device(), Device::cuda);
    std::vector<float> x = testing::random_floats(1000, rng);
    DeviceFloats a(x), b(std::vector<float>(1000, 0.f));
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) c.all_reduce(a.p, a.n, DType::f32, op);
    EXPECT_EQ(a.host(compute), x);
    c.all_gather(a.p, b.p, a.n, DType::f32);
    EXPECT_EQ(b.host(compute), x);
    DeviceFloats d(std::vector<float>(1000, 0.f));
    c.reduce_scatter(a.p, d.p, a.n, DType::f32, ReduceOp::sum);
    EXPECT_EQ(d.host(compute), x);
    DeviceFloats e(std::vector<float>(1000, 0.f));
    size_t counts[1] = {1000};
    c.all_to_all_v(a.p, counts, e.p, counts, DType::f32);
    EXPECT_EQ(e.host(compute), x);
    DeviceFloats f(std::vector<float>(1000, 0.f));
    c.send_recv(a.p, 1000, 0, f.p, 1000, 0, DType::f32);
    EXPECT_EQ(f.host(compute), x);
    c.broadcast(a.p, a.n, DType::f32, 0);
    c.barrier();
    CommHandle h = c.all_reduce_async(a.p, a.n, DType::f32, ReduceOp::sum);
    while (!h.test()) {
    }
    EXPECT_EQ(a.host(compute), x);
    std::unique_ptr<Comm> sub = c.split(0, 0, "sub");
    EXPECT_EQ(sub->size(), 1);
    sub->all_reduce(a.p, a.n, DType::f32, ReduceOp::sum);
    EXPECT_EQ(a.host(compute), x);
    EXPECT_EQ(c.counters()[CommOp::all_reduce].calls, 4u);
  }
  cudaStreamDestroy(compute);
}

// A communicator with wide_sums reduces 16-bit values in fp32 on its stream (widen, reduce, round):
// with one rank every 16-bit value comes back exactly, in place and scattered, bf16 and f16.
TEST(NcclComm, WideSumsOfSixteenBitValuesRoundTripOnOneRank) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(testing::test_seed() + 1);
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreate(&compute), cudaSuccess);
  {
    SelfComm boot("boot");
    NcclComm c(boot, compute, "tp.nccl", /*wide_sums=*/true);
    for (DType t : {DType::bf16, DType::f16}) {
      const size_t n = 999;
      std::vector<uint16_t> x(n);
      for (auto& v : x) v = t == DType::bf16 ? f32_to_bf16(float(rng() % 2000) / 7.f - 100.f)
                                             : f32_to_f16(float(rng() % 2000) / 7.f - 100.f);
      uint16_t *a = nullptr, *b = nullptr;
      ASSERT_EQ(cudaMalloc(&a, n * 2), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&b, n * 2), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(a, x.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) c.all_reduce(a, n, t, op);
      c.reduce_scatter(a, b, n, t, ReduceOp::sum);
      std::vector<uint16_t> ga(n), gb(n);
      ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(ga.data(), a, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(gb.data(), b, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(ga, x) << dtype_name(t);
      EXPECT_EQ(gb, x) << dtype_name(t);
      cudaFree(a);
      cudaFree(b);
    }
  }
  cudaStreamDestroy(compute);
}

}  // namespace
}  // namespace mt::parallel

#else
TEST(NcclComm, OneRankCollectivesAreIdentitiesOrCopiesOnTheDevice) { GTEST_SKIP() << "built without NCCL"; }
#endif
