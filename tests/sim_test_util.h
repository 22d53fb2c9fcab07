// Shared pieces of the simulated runtime's tests (tests/test_sim_*.cpp): a fixture that resets the
// device around each test and hands out memory, streams and events, and small checks on bytes and
// messages. Each test binary is one translation unit, so the helpers are defined here, inline.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "sim/sim.h"
#include "tests/test_util.h"

namespace mt::testing::sim {

using bytes = std::vector<unsigned char>;

inline std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", (unsigned long long)(uintptr_t)p);
  return buf;
}

inline bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

class Sim : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
    mt::sim::set_eager(false);
    rng_.seed(mt::testing::test_seed());
  }
  void TearDown() override {
    mt::sim::set_eager(false);
    cudaDeviceReset();
  }
  unsigned char* device(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess);
    return static_cast<unsigned char*>(p);
  }
  unsigned char* pinned(size_t n, unsigned char fill) {
    void* p = nullptr;
    EXPECT_EQ(cudaHostAlloc(&p, n, cudaHostAllocDefault), cudaSuccess);
    std::memset(p, fill, n);
    return static_cast<unsigned char*>(p);
  }
  cudaStream_t stream(unsigned flags = cudaStreamDefault) {
    cudaStream_t s = nullptr;
    EXPECT_EQ(flags == cudaStreamDefault ? cudaStreamCreate(&s) : cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
    return s;
  }
  cudaEvent_t event(unsigned flags = cudaEventDefault) {
    cudaEvent_t e = nullptr;
    EXPECT_EQ(flags == cudaEventDefault ? cudaEventCreate(&e) : cudaEventCreateWithFlags(&e, flags), cudaSuccess);
    return e;
  }
  // The device's bytes now, after all the work a blocking copy waits for.
  bytes read(const void* d, size_t n) {
    bytes h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess) << mt::sim::last_message();
    return h;
  }
  size_t random_size() { return std::uniform_int_distribution<size_t>(1, 20000)(rng_); }
  unsigned char random_byte() { return (unsigned char)std::uniform_int_distribution<int>(1, 255)(rng_); }
  std::mt19937_64 rng_;
};

inline bool all_equal(const unsigned char* p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) return false;
  return true;
}

inline void read_one_byte(const void* p) { (void)*static_cast<const volatile unsigned char*>(p); }
inline void write_one_byte(void* p) { *static_cast<volatile unsigned char*>(p) = 1; }

}  // namespace mt::testing::sim
