// What the simulated NCCL's MPI tests share (tests/mpi/mpi_sim_nccl_test.cpp, what the stand-in does;
// mpi_sim_nccl_failures_test.cpp, what it refuses): the datatypes, ops and counts, a host reference of
// each reduction, and the fixture that makes each test's communicator.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "sim/sim.h"
#include "tests/mpi/mpi_test_util.h"


namespace mt::testing::sim_nccl {

using Bytes = std::vector<uint8_t>;
using mt::testing::mpi_world;
using mt::testing::same_on_all_ranks;
using Clock = std::chrono::steady_clock;

inline constexpr ncclDataType_t kTypes[] = {ncclFloat32, ncclBfloat16, ncclFloat16, ncclInt32, ncclUint8};
inline constexpr ncclRedOp_t kOps[] = {ncclSum, ncclAvg, ncclMax};
inline constexpr size_t kCounts[] = {1, 7, 1031};  // odd and prime, and one above the eager limit once multiplied

inline size_t size_of(ncclDataType_t t) { return t == ncclFloat32 || t == ncclInt32 ? 4 : t == ncclUint8 ? 1 : 2; }

inline const char* name_of(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return "float32";
    case ncclBfloat16: return "bfloat16";
    case ncclFloat16: return "float16";
    case ncclInt32: return "int32";
    default: return "uint8";
  }
}

inline const char* name_of(ncclRedOp_t op) { return op == ncclSum ? "sum" : op == ncclAvg ? "avg" : "max"; }

inline bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

inline std::string last_error() { return ncclGetLastError(nullptr); }

// --- the reference: rank-order reductions on the host, written from the contract (sim/nccl_run.cpp's
// header), with runtime/dtype.h's conversions ---

inline float load(const Bytes& b, size_t i, ncclDataType_t t) {
  uint16_t h;
  float f;
  switch (t) {
    case ncclFloat32: std::memcpy(&f, b.data() + 4 * i, 4); return f;
    case ncclBfloat16: std::memcpy(&h, b.data() + 2 * i, 2); return mt::bf16_to_f32(h);
    default: std::memcpy(&h, b.data() + 2 * i, 2); return mt::f16_to_f32(h);
  }
}

inline void store(Bytes& b, size_t i, float v, ncclDataType_t t) {
  if (t == ncclFloat32) {
    std::memcpy(b.data() + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = t == ncclBfloat16 ? mt::f32_to_bf16(v) : mt::f32_to_f16(v);
  std::memcpy(b.data() + 2 * i, &h, 2);
}

inline float round_to(float v, ncclDataType_t t) {
  return t == ncclBfloat16 ? mt::round_bf16(v) : t == ncclFloat16 ? mt::round_f16(v) : v;
}

// The reduction of inputs[0..n) in rank order, element by element.
inline Bytes reference(const std::vector<Bytes>& inputs, size_t count, ncclDataType_t t, ncclRedOp_t op) {
  const int n = int(inputs.size());
  Bytes out(count * size_of(t));
  for (size_t i = 0; i < count; i++) {
    if (t == ncclInt32) {
      int32_t acc, v;
      std::memcpy(&acc, inputs[0].data() + 4 * i, 4);
      for (int r = 1; r < n; r++) {
        std::memcpy(&v, inputs[size_t(r)].data() + 4 * i, 4);
        acc = op == ncclMax ? std::max(acc, v) : int32_t(uint32_t(acc) + uint32_t(v));
      }
      if (op == ncclAvg) acc /= n;
      std::memcpy(out.data() + 4 * i, &acc, 4);
    } else if (t == ncclUint8) {
      uint8_t acc = inputs[0][i];
      for (int r = 1; r < n; r++)
        acc = op == ncclMax ? std::max(acc, inputs[size_t(r)][i]) : uint8_t(acc + inputs[size_t(r)][i]);
      if (op == ncclAvg) acc = uint8_t(acc / n);
      out[i] = acc;
    } else {
      float acc = load(inputs[0], i, t);
      for (int r = 1; r < n; r++) {
        const float v = load(inputs[size_t(r)], i, t);
        acc = op == ncclMax ? (v > acc ? v : acc) : round_to(acc + v, t);
      }
      if (op == ncclAvg) acc = round_to(acc / float(n), t);
      store(out, i, acc, t);
    }
  }
  return out;
}

inline Bytes slice(const Bytes& b, size_t from, size_t bytes) {
  return Bytes(b.begin() + std::ptrdiff_t(from), b.begin() + std::ptrdiff_t(from + bytes));
}

// --- the fixture ---

class SimNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
    unsetenv("MT_SIM_NCCL_TIMEOUT");
    rank_ = mpi_world().rank();
    size_ = mpi_world().size();
    comm_ = make_comm();
    ASSERT_NE(comm_, nullptr) << last_error();
  }

  void TearDown() override {
    if (comm_ && abort_) {
      EXPECT_EQ(ncclCommAbort(comm_), ncclSuccess);
    } else if (comm_) {
      EXPECT_EQ(ncclCommFinalize(comm_), ncclSuccess) << last_error();
      EXPECT_EQ(ncclCommDestroy(comm_), ncclSuccess) << last_error();
    }
    unsetenv("MT_SIM_NCCL_TIMEOUT");
    cudaDeviceReset();
    mpi_world().comm().barrier();  // the next test starts on every rank together
  }

  // A communicator of every world rank, its id made by world rank 0.
  ncclComm_t make_comm() {
    ncclUniqueId id{};
    if (rank_ == 0) {
      EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    }
    mpi_world().comm().broadcast(&id, sizeof id / 4, mt::DType::i32, 0);
    ncclComm_t c = nullptr;
    EXPECT_EQ(ncclCommInitRank(&c, size_, id, rank_), ncclSuccess) << last_error();
    return c;
  }

  // The test makes the communicator fail: abort it at the end (its peers may have left).
  void expect_failure(const char* timeout_s) {
    abort_ = true;
    setenv("MT_SIM_NCCL_TIMEOUT", timeout_s, 1);
  }

  uint8_t* device(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    return static_cast<uint8_t*>(p);
  }
  uint8_t* upload(const Bytes& h) {
    uint8_t* d = device(h.size());
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return d;
  }
  Bytes download(const void* d, size_t n) {
    Bytes h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess) << mt::sim::last_message();
    return h;
  }
  cudaStream_t stream() {
    cudaStream_t s = nullptr;
    EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess);
    return s;
  }

  // Rank r's inputs for draw `k` of this test: every rank can make every rank's.
  Bytes inputs(int r, ncclDataType_t t, size_t count, uint64_t k) {
    std::mt19937_64 rng(mt::testing::shared_seed() ^ (k * 0x9e3779b97f4a7c15ull) ^ (uint64_t(r) << 48));
    std::uniform_real_distribution<float> u(-4.f, 4.f);
    Bytes b(count * size_of(t));
    for (size_t i = 0; i < count; i++) {
      if (t == ncclInt32) {
        const uint32_t v = uint32_t(rng());
        std::memcpy(b.data() + 4 * i, &v, 4);
      } else if (t == ncclUint8) {
        b[i] = uint8_t(rng());
      } else {
        store(b, i, u(rng), t);
      }
    }
    return b;
  }
  std::vector<Bytes> all_inputs(ncclDataType_t t, size_t count, uint64_t k) {
    std::vector<Bytes> all;
    for (int r = 0; r < size_; r++) all.push_back(inputs(r, t, count, k));
    return all;
  }

  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  bool abort_ = false;
};

}  // namespace mt::testing::sim_nccl
