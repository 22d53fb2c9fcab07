// Helpers shared by the GPU unit tests (tests/test_cuda_*.cpp): device copies of host vectors, the
// storage-type conversions, comparisons against the CPU reference, and the fixtures that skip without
// a CUDA device (CudaTest) or run once per storage type (CudaOps<S>, typed over float, bf16, f16).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_array.h"
#include "kernels/cuda/tolerances.h"
#include "kernels/ops.h"
#include "runtime/check.h"
#include "runtime/dtype.h"
#include "runtime/storage.h"
#include "tests/test_util.h"

namespace mt::testing {

namespace tol = ::mt::cuda::tol;  // kernels/cuda/tolerances.h

using ::mt::cuda::DeviceArray;  // kernels/cuda/device_array.h
using ::mt::cuda::to_floats;

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Packed documents (tests/test_util.h).
inline std::vector<int32_t> random_docs(int B, int T, std::mt19937_64& rng) {
  return ::mt::testing::random_doc_ids(B, T, rng);
}

template <class S>
::testing::AssertionResult close(const std::vector<S>& got, const std::vector<S>& want, double tolerance,
                                 double floor = 1e-12) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  const std::vector<float> g = to_floats(got), w = to_floats(want);
  const double err = max_rel_error(g.data(), w.data(), g.size(), floor);
  if (err <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max rel error " << err << " > tolerance " << tolerance;
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (mt::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937_64 rng{test_seed()};
  const mt::ops::Ctx gpu{mt::Device::cuda, nullptr};
};

// Typed over the storage type S of activations and compute weights.
template <class S>
class CudaOps : public CudaTest {
 protected:
  std::vector<S> values(size_t n, float lo = -1.f, float hi = 1.f) {
    const std::vector<float> f = random_floats(n, rng, lo, hi);
    std::vector<S> out(n);
    for (size_t i = 0; i < n; i++) out[i] = mt::store_as<S>(f[i]);
    return out;
  }
  static double tol_of(const tol::Tolerance& t) { return t.of<S>(); }
};

struct StorageNames {
  template <class S>
  static std::string GetName(int) {
    return mt::dtype_name(mt::dtype_of<S>());
  }
};
using StorageTypes = ::testing::Types<float, bf16, f16>;

}  // namespace mt::testing
