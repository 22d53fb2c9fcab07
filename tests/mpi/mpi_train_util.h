// Shared by the MPI trainer tests (data and tensor parallelism): one small corpus for every rank.
#pragma once
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "data/shard.h"
#include "parallel/comm.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"

namespace mt::testing {

// Rank 0 writes a corpus of 300 short documents of slowly rising token ids (vocabulary 64) and every
// rank gets its path (the config must match across ranks). Written once per process.
inline std::string shared_corpus(parallel::Comm& world) {
  static std::string path;
  if (!path.empty()) return path;
  char buf[256] = {};
  if (world.rank() == 0) {
    const std::string dir = make_temp_dir("mt_corpus");
    data::ShardBuilder b(64, 63);
    std::mt19937_64 rng(shared_seed());
    for (int d = 0; d < 300; d++) {
      std::vector<int32_t> doc(size_t(8 + rng() % 30));
      int32_t x = int32_t(rng() % 63);
      for (auto& t : doc) t = x = (x + 1 + int32_t(rng() % 3)) % 63;
      b.add_document(doc);
    }
    b.write(dir + "/corpus.bin");
    std::snprintf(buf, sizeof buf, "%s/corpus.bin", dir.c_str());
  }
  world.broadcast(buf, sizeof buf / 4, DType::i32, 0);
  path = buf;
  return path;
}

}  // namespace mt::testing
