// Small helpers shared by the unit tests: seeded random fills and error measures.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace mt::testing {

// A fresh seed per test run unless MT_TEST_SEED pins it; printed so a failure can be replayed.
uint64_t test_seed();

std::vector<float> random_floats(size_t n, std::mt19937_64& rng, float lo = -1.f, float hi = 1.f);
std::vector<double> random_doubles(size_t n, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0);
// n integers drawn uniformly from [lo, hi].
std::vector<int32_t> random_ints(size_t n, int lo, int hi, std::mt19937_64& rng);

// max_i |a_i - b_i| / max(max_i |b_i|, floor)
double max_rel_error(const float* a, const float* b, size_t n, double floor = 1e-12);
// The floor for comparing log-sum-exps: an error in a sum of exponentials is an absolute error in its
// log, so lse is compared relative to max(1, |lse|). Relative to |lse| alone, a row whose one score
// is near zero (T = 1) failed on a rounding of 6e-7 (seed 2903984997).
inline constexpr double kLseFloor = 1.0;
double max_rel_error(const double* a, const double* b, size_t n, double floor = 1e-12);

// Packed-document ids for a (B, T) batch: per row 0, 1, 2, ... in runs of random length up to T/3,
// the first run at least two tokens long (so some token attends to more than itself).
std::vector<int32_t> random_doc_ids(int B, int T, std::mt19937_64& rng);

// dL/dx for every element of x by central differences with step h; loss() reads x (restored after).
inline std::vector<double> central_differences(const std::function<double()>& loss, std::vector<double>& x, double h) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// A fresh empty directory under the system temp dir, removed by the caller if wanted.
std::string make_temp_dir(const std::string& prefix);

}  // namespace mt::testing
