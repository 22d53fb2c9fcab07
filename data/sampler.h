// Which training window each batch row reads: a pure function, no hidden RNG state.
//
// Global stream. Training consumes one global stream of samples. Position p of that stream (p = 0,
// 1, 2, ...) counts windows since the start of training. One global micro-batch is D*B consecutive
// positions, where D is the data-parallel size and B the rows each rank reads; dp rank r takes the
// contiguous slice [r*B, (r+1)*B) of it:
//
//     position(step, r, row) = step*D*B + r*B + row        (global_position below)
//
// so ranks read disjoint rows, every tensor/pipeline/context rank of one replica (same dp rank)
// reads the same rows, and the loader's resumable state is just the global position, which does
// not depend on D. Restoring under another D continues the same global sequence: no duplicate, no gap.
//
// Single dataset with W windows: epoch = p / W, i = p % W, and the window is
//   shuffled:   perm_{seed, epoch}(i), a fresh pseudo-random permutation of [0, W) per epoch, so an
//               epoch visits every window exactly once and each epoch is reshuffled;
//   sequential: i itself (batch i covers windows i*D*B .. i*D*B + D*B - 1, wrapping at the end).
//
// Mixture of K datasets with weights w_k: position p draws its dataset from (seed, p) alone with
// probability w_k / sum(w) (an independent, deterministic draw), then takes the next unread sample
// of that dataset's own stream (its own epochs and permutations, keyed by seed and k). The loader
// state records how many samples each dataset has handed out.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace mt::data {

enum class SampleMode { shuffled, sequential };
const char* sample_mode_name(SampleMode m);
SampleMode sample_mode_from_name(const std::string& s);  // fails naming the value

// A 64-bit mixer (the splitmix64 finaliser, Steele et al. 2014) folded over several words.
uint64_t mix64(uint64_t x);
uint64_t hash_words(std::initializer_list<uint64_t> words);

// A keyed pseudo-random permutation of [0, n): a balanced Feistel network (Luby & Rackoff 1988)
// on the smallest even number of bits covering n, with cycle walking (Black & Rogaway 2002) to
// stay inside [0, n). O(1) memory and time per lookup, so no table of W entries is ever built.
class Permutation {
 public:
  Permutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t n_, key_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t round(uint64_t i) const;
};

inline uint64_t global_position(uint64_t step, int dp_rank, int dp_size, int B, int row) {
  return (step * uint64_t(dp_size) + uint64_t(dp_rank)) * uint64_t(B) + uint64_t(row);
}

struct SampleRef {
  uint32_t dataset = 0;
  uint64_t epoch = 0;   // of that dataset's own stream
  uint64_t window = 0;  // window index inside that dataset
};

// The window schedule of one or more datasets (see the top of this file).
class Sampler {
 public:
  // windows[k]: number of windows of dataset k (> 0); weights[k] > 0 (ignored for one dataset).
  Sampler(std::vector<uint64_t> windows, std::vector<double> weights, SampleMode mode, uint64_t seed);

  size_t num_datasets() const { return windows_.size(); }
  uint64_t num_windows(size_t k) const { return windows_[k]; }
  SampleMode mode() const { return mode_; }

  // Which dataset global position p draws from.
  uint32_t dataset_at(uint64_t p) const;
  // The n-th sample (0-based, counted since the start of training) of dataset k.
  SampleRef sample(uint32_t k, uint64_t n) const;

 private:
  std::vector<uint64_t> windows_;
  std::vector<double> cumulative_;  // normalised cumulative weights, last = 1
  SampleMode mode_;
  uint64_t seed_;
};

}  // namespace mt::data
