// Shared by the MPI trainer tests (data, tensor and pipeline parallelism): one small corpus for every
// rank, and a layout's loss curve and final weights measured against a single-rank run's.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "data/shard.h"
#include "model/gpt.h"
#include "parallel/comm.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/test_util.h"
#include "train/trainer.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mt::testing {

// Rank 0 writes a corpus of 300 short documents of slowly rising token ids (vocabulary 64) and every
// rank gets its path (the config must match across ranks). Written once per process and seed; the
// seed is the run's test seed unless a test fixes it (`seed` != 0).
inline std::string shared_corpus(parallel::Comm& world, uint64_t seed = 0) {
  static std::map<uint64_t, std::string> paths;
  std::string& path = paths[seed];
  if (!path.empty()) return path;
  char buf[256] = {};
  if (world.rank() == 0) {
    const std::string dir = make_temp_dir("mt_corpus");
    data::ShardBuilder b(64, 63);
    std::mt19937_64 rng(seed != 0 ? seed : shared_seed());
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

// The GPUs a test on `ranks` ranks needs (one per rank, one node), or why it cannot run here ("" when
// it can). On the simulated device every process has a device of its own.
inline std::string gpus_missing(int ranks) {
#if !defined(MT_HAVE_CUDA)
  (void)ranks;
  return "a build without CUDA";
#elif defined(MT_CUDA_SIM)
  (void)ranks;
  return "";
#else
  if (cuda::device_count() < ranks)
    return strfmt("needs one GPU per rank (%d), found %d", ranks, cuda::device_count());
  return "";
#endif
}

// A tiny model (vocabulary 64, 2 layers of width 32) on the device over `data`, `steps` steps, with
// `args` added: the simulated device's layout tests.
inline config::TrainOptions tiny_on_device(const std::string& data, std::vector<std::string> args, int steps) {
  for (const char* a : {"model.vocab_size=64", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
                        "model.block_size=16", "seq_len=16", "batch_size=2", "threads=1", "data.prefetch=0"})
    args.push_back(a);
  args.push_back("steps=" + std::to_string(steps));
  args.push_back("data.path=" + data);
  config::TrainOptions o = config::parse_train_options(args);
  o.device = Device::cuda;
  return o;
}

// The test corpus for a world of two ranks with a (simulated) GPU each; "" when this world is not one.
inline std::string two_gpu_corpus(parallel::Comm& world) {
  if (world.size() != 2) return "";
  return gpus_missing(world.size()).empty() ? shared_corpus(world) : "";
}

// How close an fp32 run on the device must follow the same layout on the CPU (losses: max relative
// error; weights: weight_err). On a GPU, reduction orders and FMA contraction differ from the CPU's.
// On the simulated device the products are the CPU's own GEMM, so the loss keeps the project's fp32
// bound; the device's reductions (norms, softmax, layernorm) still sum in another order, and the
// weights take the reordered-sum bound of expect_fp32_match below (AdamW's early updates are about
// lr*sign(g): seen 1.03e-5 for one seed of dp=2 ZeRO-1 after 5 steps).
#ifdef MT_CUDA_SIM
inline constexpr double kDeviceLossTol = 1e-5, kDeviceWeightTol = 1e-4;
#else
inline constexpr double kDeviceLossTol = 1e-4, kDeviceWeightTol = 1e-3;
#endif

// True on every rank when the first and the last pipeline rank hold the same bits of wte (master).
inline bool tied_copies_equal(train::Trainer& t) {
  parallel::Comm& pp = t.mesh().pp_comm();
  const std::vector<float> full = t.full_master();
  const ParamEntry* e = t.params().find("transformer.wte.weight");
  int32_t differ = 0;
  if (pp.rank() == 0 || pp.rank() == pp.size() - 1) {
    std::vector<float> other(size_t(e->numel));
    const int peer = pp.rank() == 0 ? pp.size() - 1 : 0;
    pp.send_recv(full.data() + e->offset, size_t(e->numel), peer, other.data(), size_t(e->numel), peer, DType::f32);
    differ = std::memcmp(other.data(), full.data() + e->offset, size_t(e->numel) * 4) != 0;
  }
  parallel::Comm& world = mpi_world().comm();
  world.all_reduce(&differ, 1, DType::i32, parallel::ReduceOp::max);
  return differ == 0;
}

// A whole model apart from any trainer, with a run's initial weights (fp32, host memory): the
// reference the per-rank gradient tests run a rank's micro-batches through.
struct WholeModel {
  explicit WholeModel(const config::TrainOptions& o) : gpt(o.model, store) {
    store.finalize(arena, DType::f32);
    gpt.init_weights(o.seed);
    gpt.set_arena(&arena);
  }
  Arena arena;
  ParamStore store;
  model::GPT gpt;
};

struct Curve {
  std::vector<double> loss, norm;
  std::vector<std::vector<float>> weights;
};

// Whether a run learned, above the noise of a small batch: a step's batch is a few dozen tokens, whose
// loss moves by more than ten steps' progress (seed 3708027791 ended a pp run, and 3133180849 a bf16
// tp run, above its first step), so the mean of the last three steps is held against the first three.
inline bool learns(const std::vector<double>& loss) {
  if (loss.size() < 6) return !loss.empty() && loss.back() < loss.front();
  const auto mean3 = [&](size_t at) { return (loss[at] + loss[at + 1] + loss[at + 2]) / 3; };
  return mean3(loss.size() - 3) < mean3(0);
}

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

// A layout's fp32 run against the single-rank run of the same global batch.
// A layout's trainer stepped beside its single-rank reference, both curves recorded (losses, norms).
// With mixture layers the same assignments are routed and dropped (tokens per expert and the drop
// fraction, exactly) and the balance term is the reference's, step by step. Returns the reference's
// summed drop fraction (a test with a capacity checks that something was dropped).
inline double step_beside(train::Trainer& ref, train::Trainer& t, int steps, Curve& want, Curve& got,
                          const std::string& what) {
  double dropped = 0;
  for (int i = 0; i < steps; i++) {
    const train::StepResult a = ref.step(), b = t.step();
    want.loss.push_back(a.loss), want.norm.push_back(a.grad_norm);
    got.loss.push_back(b.loss), got.norm.push_back(b.grad_norm);
    if (a.moe.is_null()) continue;
    EXPECT_EQ(b.moe["tokens_per_expert"], a.moe["tokens_per_expert"]) << what << " step " << i + 1;
    EXPECT_EQ(b.moe["drop_fraction"], a.moe["drop_fraction"]) << what << " step " << i + 1;
    const double balance = a.moe["balance"].get<double>();
    EXPECT_NEAR(b.moe["balance"].get<double>(), balance, 1e-5 * std::fabs(balance))
        << what << " step " << i + 1 << ": the balance term over the whole micro-batch";
    dropped += a.moe["drop_fraction"].get<double>();
  }
  return dropped;
}

// The bytes each operation sent, against the planner's (plan::CommPlan's groups): the figure the
// planner promises. Its call counts group messages differently (a send_recv is one send), so they
// are not compared here.
inline void expect_same_bytes(const parallel::CommCounters& got, const parallel::CommCounters& want,
                              const std::string& what) {
  for (int op = 0; op < parallel::kNumCommOps; op++)
    EXPECT_EQ(got.ops[size_t(op)].sent_bytes, want.ops[size_t(op)].sent_bytes)
        << what << ": " << parallel::comm_op_name(parallel::CommOp(op));
}

struct CurveErr {
  double loss = 0;        // max relative loss error over the steps
  double first_norm = 0;  // the first step's relative gradient-norm error: identical weights
  double norm = 0;        // max relative gradient-norm error over the steps
  double weights = 0;     // weight_err of the final weights
  std::string str() const {
    char b[160];
    std::snprintf(b, sizeof b, "loss max rel err %.2e, grad norm %.2e (first step %.2e), weights %.2e", loss, norm,
                  first_norm, weights);
    return b;
  }
};

inline CurveErr curve_err(const Curve& got, const Curve& want) {
  CurveErr e;
  e.loss = max_rel(got.loss, want.loss);
  e.norm = max_rel(got.norm, want.norm);
  e.first_norm = std::fabs(got.norm.front() - want.norm.front()) / want.norm.front();
  e.weights = weight_err(got.weights, want.weights);
  return e;
}

// The bounds for a reordered fp32 sum. The gradient norm catches a constant factor on the gradient
// (a loss normalised by the wrong token count, a parameter counted twice) that clipping and AdamW hide
// from the loss and weights: the first step's, from identical weights, is held tight; later steps
// follow the weights, which drift further, because AdamW's early updates are about lr*sign(g) and an
// element whose gradient is a near-cancelling sum flips with the summation order (seen: 1.2e-5 after
// 20 steps for one seed in a few hundred).
inline void expect_fp32_match(const CurveErr& e, const std::string& what) {
  EXPECT_LE(e.loss, 1e-5) << what;
  EXPECT_LE(e.first_norm, 1e-6) << what << ": the norm must count every parameter once";
  EXPECT_LE(e.norm, 1e-4) << what;
  EXPECT_LE(e.weights, 1e-4) << what;
}

}  // namespace mt::testing
