// Helpers shared by the warp-emulator tests (tests/test_emu_*.cpp): launching a kernel header's
// kernel at its launcher's shape, storage-type conversions as the CPU backend does them, NaN-filled
// outputs, and error measures.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/column_sum_kernels.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/encoder_kernels.cuh"
#include "kernels/cuda/warp_emulation.h"
#include "runtime/dtype.h"
#include "runtime/storage.h"
#include "tests/test_util.h"

namespace mt::testing::emu {

// The emulator timing of this test run: MT_EMU_TIMING=early selects cuda::emu::Timing::early (each warp
// runs ahead to the next block barrier; copies land at once), anything else the default late timing.
// ctest runs every emulator test under both (tests/CMakeLists.txt).
inline cuda::emu::Timing timing_of_run() {
  const char* t = std::getenv("MT_EMU_TIMING");
  return t && std::string(t) == "early" ? cuda::emu::Timing::early : cuda::emu::Timing::late;
}

// Runs a kernel on the emulator with the shape its launcher gives it, under the run's timing.
template <class Kernel, class... Args>
void run(const cuda::LaunchShape& l, Kernel kernel, Args... args) {
  const cuda::emu::TimingScope scope(timing_of_run());
  cuda::emu::launch(l.grid, l.block, l.smem, kernel, args...);
}

// encoder.cu's backward scatter: the pair kernel, a stable sort by key (CUB's radix sort on the GPU,
// std::stable_sort here: the same order), then the run kernel. Keys outside [row0, row0 + limit) add
// nothing (the vocabulary-parallel embedding).
template <class D>
void emulated_scatter(float* dst, const D* src, const int32_t* keys, int rows, int T, int C, int row0 = 0,
                      int limit = INT32_MAX) {
  namespace enc = cuda::encoder_kernels;
  std::vector<uint32_t> key(static_cast<size_t>(rows));
  std::vector<int32_t> row(static_cast<size_t>(rows));
  run(enc::pairs_shape(rows), enc::sort_pairs_kernel, key.data(), row.data(), keys, rows, T, row0, limit);
  std::vector<std::pair<uint32_t, int32_t>> pairs;
  for (int r = 0; r < rows; r++) pairs.emplace_back(key[size_t(r)], row[size_t(r)]);
  std::stable_sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (int r = 0; r < rows; r++) key[size_t(r)] = pairs[size_t(r)].first, row[size_t(r)] = pairs[size_t(r)].second;
  run(enc::runs_shape(rows, C), enc::sum_runs_kernel<D>, dst, src, static_cast<const uint32_t*>(key.data()),
      static_cast<const int32_t*>(row.data()), rows, C);
}

// The two passes of a column sum (kernels/cuda/column_sum.cuh) in the launcher's order, with its split.
template <int K, class Term>
void column_sums(cuda::column_sum_kernels::ColumnOutputs<K> outs, Term term, int R, int C) {
  namespace csk = cuda::column_sum_kernels;
  if (R <= 0 || C <= 0) return;
  const csk::ColumnSplit s = csk::column_split(R, C);
  std::vector<float> partial(csk::partial_floats(s, K), std::nanf(""));
  run(csk::partials_shape(s), csk::column_partials_kernel<K, Term>, partial.data(), term, s);
  run(csk::finish_shape(s), csk::column_finish_kernel<K>, outs, static_cast<const float*>(partial.data()), s);
}

// Values rounded to storage type S, and S values loaded into fp32, as the CPU backend rounds and loads.
template <class S>
std::vector<S> to_storage(const std::vector<float>& x) {
  std::vector<S> out(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = ::mt::store_as<S>(x[i]);
  return out;
}
template <class S>
std::vector<float> to_floats(const std::vector<S>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); i++) out[i] = ::mt::load(x[i]);
  return out;
}

// max |got - want| / max |want| (infinite when got holds a NaN that want does not).
template <class T>
double error(const std::vector<T>& got, const std::vector<T>& want) {
  const std::vector<float> g = to_floats(got), w = to_floats(want);
  return max_rel_error(g.data(), w.data(), g.size());
}

// max |a - b| / max |b| over columns [c0, c0 + width) of (rows, ld) matrices, the denominator at
// least `floor`.
template <class S>
double part_error(const std::vector<S>& a, const std::vector<S>& b, int rows, int ld, int c0, int width,
                  double floor) {
  std::vector<float> x, y;
  for (int r = 0; r < rows; r++)
    for (int c = c0; c < c0 + width; c++) {
      x.push_back(::mt::load(a[size_t(r) * ld + c]));
      y.push_back(::mt::load(b[size_t(r) * ld + c]));
    }
  return max_rel_error(x.data(), y.data(), x.size(), floor);
}

// The errors of dQ, dK and dV, the three column blocks of a (B*T, 3C) attention gradient, each
// relative to its own largest reference value. At T = 1 dQ and dK are exactly zero (dS = dP - D = 0)
// and hold only the summation-order noise of both sides, so they are measured against the largest
// gradient of all three instead: a wrong index or mask still gives errors of order one.
template <class S>
std::vector<double> dqkv_errors(const std::vector<S>& got, const std::vector<S>& ref, int B, int T, int C) {
  double largest = 0.0;
  for (const S& x : ref) largest = std::max(largest, double(std::fabs(::mt::load(x))));
  std::vector<double> errs;
  for (int p = 0; p < 3; p++)
    errs.push_back(part_error(got, ref, B * T, 3 * C, p * C, C, T == 1 && p < 2 ? largest : 0.0));
  return errs;
}

// An output buffer of NaN (all bits set), so that an element a kernel fails to write shows.
template <class T>
std::vector<T> nans(size_t n) {
  std::vector<T> v(n);
  std::memset(static_cast<void*>(v.data()), 0xff, n * sizeof(T));
  return v;
}

// One case of the flash attention tests: the sizes, and inputs drawn at random and rounded to S.
struct AttnShape {
  int B, T, C, NH;
  bool docs;  // packed documents (a document mask)
  size_t nqkv() const { return size_t(B) * T * 3 * C; }
  size_t nout() const { return size_t(B) * T * C; }
  size_t nlse() const { return size_t(B) * NH * T; }
};
inline std::string label(const AttnShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
         " NH=" + std::to_string(s.NH) + (s.docs ? " docs" : "");
}
template <class S>
struct AttnInputs {
  // Scores of order 10 before scaling: sharp and flat rows both occur.
  AttnInputs(const AttnShape& s, std::mt19937_64& rng)
      : qkv(to_storage<S>(random_floats(s.nqkv(), rng, -2.f, 2.f))),
        doc_ids(random_doc_ids(s.B, s.T, rng)),
        doc(s.docs ? doc_ids.data() : nullptr) {}
  AttnInputs(const AttnInputs&) = delete;  // doc points into doc_ids
  AttnInputs& operator=(const AttnInputs&) = delete;
  std::vector<S> qkv;
  std::vector<int32_t> doc_ids;
  const int32_t* doc;  // nullptr without a mask
};

// The fixture of the typed tests: random inputs already rounded to the storage type S.
template <class S>
class EmulatedTest : public ::testing::Test {
 protected:
  std::vector<S> values(size_t n, float lo = -1.f, float hi = 1.f) {
    return to_storage<S>(random_floats(n, rng, lo, hi));
  }
  std::vector<float> floats(size_t n) { return random_floats(n, rng); }
  std::mt19937_64 rng{test_seed()};
};
using StorageTypes = ::testing::Types<float, bf16, f16>;
struct StorageNames {
  template <class S>
  static std::string GetName(int) {
    return dtype_name(dtype_of<S>());
  }
};

}  // namespace mt::testing::emu
