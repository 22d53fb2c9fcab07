#include "data/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "runtime/check.h"

namespace mt::data {

namespace {
constexpr int kFeistelRounds = 6;
// Domain-separation constants so the dataset choice and the permutations use unrelated streams.
constexpr uint64_t kTagMix = 0x6d69787475726521ull;
constexpr uint64_t kTagPerm = 0x7065726d75746521ull;
}  // namespace

const char* sample_mode_name(SampleMode m) { return m == SampleMode::shuffled ? "shuffled" : "sequential"; }

SampleMode sample_mode_from_name(const std::string& s) {
  if (s == "shuffled") return SampleMode::shuffled;
  if (s == "sequential") return SampleMode::sequential;
  fail("data mode '%s' is not one of shuffled|sequential", s.c_str());
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_words(std::initializer_list<uint64_t> words) {
  uint64_t h = 0x243f6a8885a308d3ull;
  for (uint64_t w : words) h = mix64(h ^ mix64(w));
  return h;
}

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
  MT_CHECK(n > 0, "a permutation of an empty range");
  int bits = n <= 1 ? 0 : int(std::bit_width(n - 1));  // 2^bits >= n
  bits = std::max(2, bits + (bits & 1));
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t(1) << half_bits_) - 1;
}

// One pass of the Feistel network over [0, 2^(2 half_bits)): (L, R) -> (R, L ^ F_k(R)) per round.
uint64_t Permutation::round(uint64_t x) const {
  uint64_t l = x >> half_bits_, r = x & half_mask_;
  for (int k = 0; k < kFeistelRounds; k++) {
    uint64_t f = mix64(key_ ^ mix64(r + uint64_t(k) * 0x9e3779b97f4a7c15ull)) & half_mask_;
    uint64_t nl = r;
    r = l ^ f;
    l = nl;
  }
  return (l << half_bits_) | r;
}

uint64_t Permutation::operator()(uint64_t i) const {
  MT_CHECK(i < n_, "permutation index %llu out of range %llu", (unsigned long long)i, (unsigned long long)n_);
  if (n_ == 1) return 0;
  // Cycle walking: the network permutes a domain of < 4n values; re-applying it until the value
  // falls inside [0, n) restricts it to a permutation of [0, n) (expected < 4 passes).
  uint64_t x = round(i);
  while (x >= n_) x = round(x);
  return x;
}

Sampler::Sampler(std::vector<uint64_t> windows, std::vector<double> weights, SampleMode mode, uint64_t seed)
    : windows_(std::move(windows)), mode_(mode), seed_(seed) {
  MT_CHECK(!windows_.empty(), "a sampler needs at least one dataset");
  MT_CHECK(weights.size() == windows_.size(), "%zu weights for %zu datasets", weights.size(), windows_.size());
  double total = 0;
  for (size_t k = 0; k < weights.size(); k++) {
    MT_CHECK(windows_[k] > 0, "dataset %zu has no windows", k);
    if (!(weights[k] > 0) || !std::isfinite(weights[k]))
      fail("data mixture weight %g of dataset %zu must be positive", weights[k], k);
    total += weights[k];
  }
  double acc = 0;
  for (double w : weights) cumulative_.push_back((acc += w) / total);
  cumulative_.back() = 1.0;
}

uint32_t Sampler::dataset_at(uint64_t p) const {
  if (windows_.size() == 1) return 0;
  // 53 random bits -> u uniform in [0, 1); the first k with u < cumulative_k.
  double u = double(hash_words({seed_, kTagMix, p}) >> 11) * 0x1.0p-53;
  for (size_t k = 0; k + 1 < cumulative_.size(); k++)
    if (u < cumulative_[k]) return uint32_t(k);
  return uint32_t(cumulative_.size() - 1);
}

SampleRef Sampler::sample(uint32_t k, uint64_t n) const {
  MT_CHECK(k < windows_.size(), "dataset %u of %zu", k, windows_.size());
  uint64_t w = windows_[k];
  SampleRef s;
  s.dataset = k;
  s.epoch = n / w;
  uint64_t i = n % w;
  s.window = mode_ == SampleMode::sequential ? i : Permutation(w, hash_words({seed_, kTagPerm, k, s.epoch}))(i);
  return s;
}

}  // namespace mt::data
