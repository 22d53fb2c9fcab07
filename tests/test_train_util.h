// Shared by the trainer tests: small token shards written with the data library.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "data/shard.h"

namespace mt::testing {

// `docs` documents of uniformly random tokens in [0, vocab - 1) (the last id is the end-of-text
// token), 8 to 47 tokens each, written to dir/random.bin; returns its path.
inline std::string write_random_shard(const std::string& dir, int vocab, int docs, uint64_t seed) {
  data::ShardBuilder b(vocab, vocab - 1);
  std::mt19937_64 rng(seed);
  for (int d = 0; d < docs; d++) {
    std::vector<int32_t> doc(size_t(8 + rng() % 40));
    for (auto& t : doc) t = int32_t(rng() % uint64_t(vocab - 1));
    b.add_document(doc);
  }
  const std::string path = dir + "/random.bin";
  b.write(path);
  return path;
}

// A learnable corpus: documents that count upwards from a random start modulo `vocab - 1` (the last
// id is the end-of-text token), so next-token prediction is easy and the loss must fall fast. Written
// to dir/counting.bin; returns its path.
inline std::string write_counting_shard(const std::string& dir, int vocab, int docs, uint64_t seed) {
  data::ShardBuilder b(uint32_t(vocab), uint32_t(vocab - 1));
  std::mt19937_64 rng(seed);
  for (int d = 0; d < docs; d++) {
    std::vector<int32_t> doc(size_t(8 + rng() % 40));
    int32_t x = int32_t(rng() % uint64_t(vocab - 1));
    for (auto& t : doc) t = x = (x + 1) % (vocab - 1);
    b.add_document(doc);
  }
  const std::string path = dir + "/counting.bin";
  b.write(path);
  return path;
}

}  // namespace mt::testing
