// The shared machinery of the selftest's op checks (selftest_checker.h): the seeded input draws and the
// comparisons, each recorded as one table row; perturbation corrupts one device value per comparison.
#include <algorithm>
#include <cmath>
#include <random>

#include "cli/selftest_checker.h"
#include "runtime/check.h"

#ifdef MT_HAVE_CUDA

namespace mt::cli::selftest_detail {

Checker::Checker(std::string op, uint64_t seed, bool perturb, std::vector<OpCheckResult>& out)
    : op_(std::move(op)), perturb_(perturb), out_(out) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the name: each check has its own stream
  for (char ch : op_) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(h), uint32_t(h >> 32)};
  rng.seed(seq);
  perturb_rng_.seed(seed ^ h);  // its own stream: perturbing changes no input
}

void Checker::at(std::string shape, std::string dtype) {
  shape_ = std::move(shape);
  dtype_ = std::move(dtype);
}

std::vector<float> Checker::floats(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<int32_t> Checker::ints(size_t n, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(rng);
  return v;
}

size_t Checker::index(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

void Checker::rel(const char* output, std::vector<float> got, const std::vector<float>& want, double tolerance) {
  MT_CHECK(got.size() == want.size() && !want.empty(), "%s: %zu values vs %zu", output, got.size(), want.size());
  double num = 0, den = 1e-30;
  for (float w : want) den = std::max(den, double(std::fabs(w)));
  // A tenth of the output's scale: above every tolerance in the table (the widest, three bf16 units in
  // the last place, is 0.023), so a perturbed comparison cannot pass.
  if (perturb_) got[perturb_index(got.size())] += float(0.1 * den);
  for (size_t i = 0; i < got.size(); i++) {
    const double d = std::fabs(double(got[i]) - double(want[i]));
    num = std::isnan(d) ? INFINITY : std::max(num, d);
    if (std::isinf(num)) break;
  }
  record(output, num / den, tolerance, "rel");
}

void Checker::rel(const char* output, double got, double want, double tolerance) {
  if (perturb_) got *= 1.001;
  const double err = std::fabs(got - want) / std::max(std::fabs(want), 1e-300);
  record(output, std::isnan(err) ? INFINITY : err, tolerance, "rel");
}

void Checker::bit_patterns(const char* output, std::vector<uint32_t> got, const std::vector<uint32_t>& want) {
  MT_CHECK(got.size() == want.size(), "%s: %zu values vs %zu", output, got.size(), want.size());
  if (perturb_) got[perturb_index(got.size())] ^= 1u;  // flip the lowest bit of one value
  size_t n = 0;
  for (size_t i = 0; i < got.size(); i++) n += got[i] != want[i];
  record(output, double(n), 0.0, "count");
}

void Checker::count(const char* output, size_t wrong) { record(output, double(wrong + (perturb_ ? 1 : 0)), 0.0, "count"); }

size_t Checker::perturb_index(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(perturb_rng_); }

void Checker::record(const char* output, double err, double tolerance, const char* measure) {
  out_.push_back(OpCheckResult{op_, output, shape_, dtype_, err, tolerance, err <= tolerance, measure, ""});
}

std::vector<int32_t> random_docs(Checker& c, int B, int T) {
  std::vector<int32_t> doc(size_t(B) * T);
  std::uniform_int_distribution<int> run(1, std::max(1, T / 3));
  for (int b = 0; b < B; b++) {
    int id = 0, left = run(c.rng);
    for (int t = 0; t < T; t++) {
      if (left-- == 0) id++, left = run(c.rng) - 1;
      doc[size_t(b) * T + t] = id;
    }
  }
  return doc;
}

}  // namespace mt::cli::selftest_detail

#endif  // MT_HAVE_CUDA
