// Internal to `minitrain selftest` (selftest_checks.cpp, selftest_attention_checks.cpp; the Checker is
// in selftest_checker.cpp): device arrays, the seeded input draws and the comparisons every op check
// uses. Only built with the CUDA backend.
#pragma once
#ifdef MT_HAVE_CUDA
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cli/selftest.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_array.h"
#include "kernels/ops.h"
#include "runtime/check.h"
#include "runtime/storage.h"

namespace mt::cli::selftest_detail {

inline const ops::Ctx kGpu{Device::cuda, nullptr};

using cuda::DeviceArray;  // kernels/cuda/device_array.h
using cuda::to_floats;
using cuda::to_storage;

// The storage types every typed check runs in are f32, bf16 and f16; f16 only at the small shapes
// (`big` marks the GPT-2-sized ones), which keeps the selftest inside its time budget.
template <class S>
constexpr bool runs_at(bool big) {
  return !(std::is_same_v<S, f16> && big);
}

// Draws the inputs of one check and records its comparisons.
class Checker {
 public:
  Checker(std::string op, uint64_t seed, bool perturb, std::vector<OpCheckResult>& out);

  std::mt19937_64 rng;

  void at(std::string shape, std::string dtype);
  template <class S>
  void at(std::string shape) {
    at(std::move(shape), dtype_name(dtype_of<S>()));
  }
  const std::string& shape() const { return shape_; }
  const std::string& dtype() const { return dtype_; }

  std::vector<float> floats(size_t n, float lo = -1.f, float hi = 1.f);
  template <class S>
  std::vector<S> values(size_t n, float lo = -1.f, float hi = 1.f) {
    return to_storage<S>(floats(n, lo, hi));
  }
  std::vector<int32_t> ints(size_t n, int lo, int hi);
  size_t index(size_t n);

  // Max relative error of a device output against the CPU output.
  void rel(const char* output, std::vector<float> got, const std::vector<float>& want, double tolerance);
  template <class S>
  void rel(const char* output, const std::vector<S>& got, const std::vector<S>& want, double tolerance) {
    rel(output, to_floats(got), to_floats(want), tolerance);
  }
  void rel(const char* output, double got, double want, double tolerance);
  // Elements whose bit patterns differ (NaN payloads included), for 2- or 4-byte elements.
  template <class T>
  void bits(const char* output, const std::vector<T>& got, const std::vector<T>& want) {
    static_assert(sizeof(T) == 2 || sizeof(T) == 4, "bit comparison of 2- or 4-byte elements");
    bit_patterns(output, patterns(got), patterns(want));
  }
  // A count of wrong answers (must be zero).
  void count(const char* output, size_t wrong);

 private:
  template <class T>
  static std::vector<uint32_t> patterns(const std::vector<T>& v) {
    std::vector<uint32_t> out(v.size(), 0);
    for (size_t i = 0; i < v.size(); i++) std::memcpy(&out[i], &v[i], sizeof(T));
    return out;
  }
  void bit_patterns(const char* output, std::vector<uint32_t> got, const std::vector<uint32_t>& want);
  size_t perturb_index(size_t n);
  void record(const char* output, double err, double tolerance, const char* measure);

  std::string op_, shape_, dtype_ = "f32";
  bool perturb_;
  std::mt19937_64 perturb_rng_;
  std::vector<OpCheckResult>& out_;
};

// Packed documents: per batch row, ids 0, 1, 2, ... in runs of random length (possibly one token).
std::vector<int32_t> random_docs(Checker& c, int B, int T);

// The attention checks (selftest_attention_checks.cpp), and the tensor-core fragment probe the flash
// checks follow (records nothing below compute capability 8.0).
void check_tensor_core_fragments(Checker& c);
void check_attention_fwd(Checker& c);
void check_attention_bwd(Checker& c);
void check_flash_attention_fwd(Checker& c);
void check_flash_attention_bwd(Checker& c);
void check_flash_block(Checker& c);
// One training step of a small GPT on both backends, fp32 and bf16 (selftest_train_check.cpp).
void check_train_step(Checker& c);

}  // namespace mt::cli::selftest_detail

#endif  // MT_HAVE_CUDA
