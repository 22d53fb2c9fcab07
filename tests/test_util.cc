#include "tests/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace mt::testing {

uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* s = std::getenv("MT_TEST_SEED");
    uint64_t v = s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
    std::fprintf(stderr, "[test seed] MT_TEST_SEED=%llu\n", (unsigned long long)v);
    return v;
  }();
  return seed;
}

std::vector<int32_t> random_doc_ids(int B, int T, std::mt19937_64& rng) {
  std::vector<int32_t> d(static_cast<size_t>(B) * size_t(T));
  std::uniform_int_distribution<int> len(1, std::max(2, T / 3));
  for (int b = 0; b < B; b++) {
    int id = 0, left = std::max(2, len(rng));
    for (int t = 0; t < T; t++) {
      if (left-- == 0) {
        id++;
        left = len(rng) - 1;
      }
      d[size_t(b) * size_t(T) + size_t(t)] = id;
    }
  }
  return d;
}

std::vector<float> random_floats(size_t n, std::mt19937_64& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<int32_t> random_ints(size_t n, int lo, int hi, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<double> random_doubles(size_t n, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

template <class T>
static double rel_error(const T* a, const T* b, size_t n, double floor) {
  double num = 0, den = floor;
  for (size_t i = 0; i < n; i++) {
    double d = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(d)) return INFINITY;
    num = std::max(num, d);
    den = std::max(den, std::fabs(double(b[i])));
  }
  return num / den;
}
double max_rel_error(const float* a, const float* b, size_t n, double floor) { return rel_error(a, b, n, floor); }
double max_rel_error(const double* a, const double* b, size_t n, double floor) { return rel_error(a, b, n, floor); }

std::string make_temp_dir(const std::string& prefix) {
  namespace fs = std::filesystem;
  std::mt19937_64 rng(std::random_device{}());
  for (int i = 0; i < 100; i++) {
    fs::path p = fs::temp_directory_path() / (prefix + "." + std::to_string(rng() % 100000000));
    if (fs::create_directory(p)) return p.string();
  }
  std::abort();
}

}  // namespace mt::testing
