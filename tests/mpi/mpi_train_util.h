// Shared by the MPI trainer tests (data, tensor and pipeline parallelism): one small corpus for every
// rank, and a layout's loss curve and final weights measured against a single-rank run's.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "data/shard.h"
#include "parallel/comm.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"
#include "train/trainer.h"

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

struct Curve {
  std::vector<double> loss, norm;
  std::vector<std::vector<float>> weights;
};

inline Curve train_curve(train::Trainer& t, int steps) {
  Curve c;
  for (int i = 0; i < steps; i++) {
    const train::StepResult r = t.step();
    c.loss.push_back(r.loss);
    c.norm.push_back(r.grad_norm);
  }
  c.weights = t.global_master();
  return c;
}

inline double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); i++) e = std::max(e, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  return e;
}

// max |a - b| / max |b| over every tensor; *worst: the tensor and element where |a - b| is largest.
inline double weight_err(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                  std::pair<size_t, size_t>* worst = nullptr) {
  double e = 0, m = 0;
  for (size_t t = 0; t < b.size(); t++)
    for (size_t k = 0; k < b[t].size(); k++) {
      const double d = std::fabs(a[t][k] - b[t][k]);
      if (d > e && worst) *worst = {t, k};
      e = std::max(e, d);
      m = std::max(m, double(std::fabs(b[t][k])));
    }
  return e / m;
}

}  // namespace mt::testing
