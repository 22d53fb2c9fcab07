// Data parallelism changes nothing but memory and speed: for every ZeRO stage, with and without
// gradient accumulation, the dp-rank run's loss curve and final weights match a single-rank run of
// the same global batch (loss, gradient norm and weights); the noise scale's per-rank input is each
// rank's own gradient norm; ZeRO-3 holds less parameter memory; the communication counted per step
// equals the theoretical volume of each stage; a state saved under one layout resumes under another;
// tensor collectives go over the device communicator when one is given (NCCL's place on GPUs); a
// flipped bit on one replica is caught by the SDC check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>

#include "data/shard.h"
#include "model/gpt.h"
#include "parallel/data_parallel.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/mpi_train_util.h"
#include "tests/test_util.h"
#include "train/batches.h"
#include "train/trainer.h"

namespace mt::testing {
namespace {

namespace fs = std::filesystem;
using config::TrainOptions;
using train::Trainer;


config::TrainOptions options(const std::string& data, int batch, int accum, int zero, int dp) {
  config::TrainOptions o = config::parse_train_options(
      {"model=tiny", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
       "model.block_size=16", "seq_len=16", "steps=20", "optim.lr=3e-3", "optim.warmup_steps=3",
       "data.mode=shuffled", "threads=1", "data.prefetch=0", "data.path=" + data});
  o.batch_size = batch;
  o.grad_accum = accum;
  o.parallel.zero = zero;
  o.parallel.dp = dp;
  o.parallel.bucket_mb = 0.01;  // several buckets even for the tiny model
  return o;
}

TEST(DataParallel, EveryZeroStageMatchesTheSingleRankRun) {
  parallel::Comm& world = mpi_world().comm();
  const int D = world.size();
  const std::string data = shared_corpus(world);
  const int B = 2;
  for (int accum : {1, 2}) {
    // The reference: one rank, the same global batch (D*B rows per micro-batch), every rank alone.
    config::TrainOptions ro = options(data, D * B, accum, 0, 1);
    Trainer ref(ro);
    const Curve want = train_curve(ref, ro.steps);
    for (int zero = 0; zero <= 3; zero++) {
      Trainer t(options(data, B, accum, zero, D), &world);
      const Curve got = train_curve(t, ro.steps);
      const CurveErr e = curve_err(got, want);
      if (world.rank() == 0) std::printf("dp=%d zero=%d accum=%d: %s\n", D, zero, accum, e.str().c_str());
      expect_fp32_match(e, "zero=" + std::to_string(zero) + " accum=" + std::to_string(accum));
      const std::vector<float> w = t.full_master();
      EXPECT_TRUE(same_on_all_ranks(world, w.data(), w.size() * 4)) << "ranks disagree on the weights";
    }
  }
}

// The device path (gradients and parameters over the dp group's NCCL communicator, the optimizer on
// the device) against the same layout on the CPU, ZeRO-1 and ZeRO-3: one GPU per rank, or the
// simulated device (tolerances: kDeviceLossTol, kDeviceWeightTol).
TEST(DataParallel, OnGpusEveryShardingMatchesTheCpuRun) {
  parallel::Comm& world = mpi_world().comm();
  const int D = world.size();
  if (D < 2) GTEST_SKIP() << "needs 2 ranks";
  if (const std::string missing = gpus_missing(D); !missing.empty()) GTEST_SKIP() << missing;
  const std::string data = shared_corpus(world);
  for (int zero : {1, 3}) {
    config::TrainOptions o = options(data, 2, 2, zero, D);
    o.steps = 5;
    Trainer cpu(o, &world);
    const Curve want = train_curve(cpu, o.steps);
    o.device = Device::cuda;
    Trainer gpu(o, &world, world.rank());
    const Curve got = train_curve(gpu, o.steps);
    const double loss_err = max_rel(got.loss, want.loss), werr = weight_err(got.weights, want.weights);
    if (world.rank() == 0)
      std::printf("dp=%d zero=%d on the device vs CPU: loss max rel err %.2e, weights %.2e\n", D, zero, loss_err, werr);
    EXPECT_LE(loss_err, kDeviceLossTol) << "zero=" << zero;
    EXPECT_LE(werr, kDeviceWeightTol) << "zero=" << zero;
  }
}

// The gradient noise scale's small-batch input is the mean over ranks of |g_r|^2, g_r the gradient
// of the mean loss over rank r's own tokens. Here g_r is computed apart from the trainer: a model
// with the same initial weights runs rank r's micro-batches (read from the same loader).
TEST(DataParallel, NoiseScaleInputIsTheMeanOfEachRanksOwnGradientNorm) {
  parallel::Comm& world = mpi_world().comm();
  const int D = world.size();
  if (D < 2) GTEST_SKIP() << "the per-rank gradient needs dp > 1";
  const std::string data = shared_corpus(world);
  // (ZeRO stage, accumulation): stage 2 reduces every micro-batch, so only with one does a rank hold
  // its whole own gradient; stage 3 never does.
  for (const auto& [zero, accum] : std::vector<std::pair<int, int>>{{0, 1}, {0, 2}, {1, 2}, {2, 1}}) {
    config::TrainOptions o = options(data, 2, accum, zero, D);
    o.parallel.embedding_rows = false;  // every parameter in the per-rank norm
    Trainer t(o, &world);
    const int rank = t.mesh().dp_comm().rank();
    WholeModel whole(o);
    ParamStore& store = whole.store;
    model::GPT& gpt = whole.gpt;
    store.zero_grads();
    std::unique_ptr<train::BatchSource> src = train::open_batches(o, "train", rank, D);
    std::vector<train::HostBatch> micro(static_cast<size_t>(accum));
    int valid = 0;
    for (auto& b : micro) {
      src->next(b);
      valid += train::valid_targets(b);
    }
    for (const auto& b : micro) gpt.forward_backward(train::view(b), 1.f / float(valid));
    double own = 0;
    for (int64_t k = 0; k < store.total_numel(); k++) own += double(store.grads()[k]) * store.grads()[k];
    const double want = parallel::all_reduce_sum_double(world, own) / D;
    const double got = t.step().local_grad_sq;
    if (world.rank() == 0)
      std::printf("dp=%d zero=%d accum=%d: per-rank |g|^2 %.6g, from each rank's own batch %.6g\n", D, zero, accum,
                  got, want);
    EXPECT_NEAR(got, want, 1e-5 * want) << "zero=" << zero << " accum=" << accum;
  }
}

TEST(DataParallel, Zero2And3HoldLessMemoryThanZero0) {
  parallel::Comm& world = mpi_world().comm();
  const int D = world.size();
  const std::string data = shared_corpus(world);
  size_t state[4] = {}, params[4] = {}, grads[4] = {}, max_unit = 0;
  for (int zero : {0, 2, 3}) {
    config::TrainOptions o = options(data, 2, 1, zero, D);
    o.model.n_layer = 8;  // so that one layer is a small part of the model
    Trainer t(o, &world);
    for (const ParamUnit& u : t.params().units()) max_unit = std::max(max_unit, size_t(u.size()) * 4);
    t.arena().reset_peaks();
    t.step();
    const MemStats& m = t.arena().stats();
    params[zero] = m.peak[size_t(MemCategory::params)];
    grads[zero] = m.peak[size_t(MemCategory::grads)];
    state[zero] = m.peak[size_t(MemCategory::params)] + m.peak[size_t(MemCategory::grads)] +
                  m.peak[size_t(MemCategory::optimizer)];
  }
  if (world.rank() == 0)
    std::printf("dp=%d model-state bytes per rank: ZeRO-0 %zu, ZeRO-3 %zu (ratio %.3f); params %zu vs %zu\n", D,
                state[0], state[3], double(state[3]) / double(state[0]), params[0], params[3]);
  if (D > 1) {
    EXPECT_LT(params[3], params[0]);
    EXPECT_LT(grads[2], grads[0]) << "ZeRO-2 must not keep a full gradient buffer";
  }
  // ZeRO-3 keeps 1/D of the model state plus what is materialised at a time: at most two gathered
  // units (the one in use and the prefetched one), the gradient buffers of the embeddings (alive
  // through backward), the current layer and at most two reductions in flight, and their chunks.
  EXPECT_LE(state[3], state[0] / size_t(D) + 7 * max_unit);
}

// The bytes each stage sends in one step (one micro-batch), from the formulas in parallel/comm.h:
//   stage 0-1: all-reduce of every gradient (2(N-1)/N P); stage 1-2 add the all-gather of the
//   parameters after the update ((N-1)/N P); stage 2-3 reduce-scatter the gradients ((N-1)/N P);
//   stage 3 gathers each unit before each use instead: forward and backward for every layer and the
//   final norm, the embeddings three times (encoder, classifier, encoder backward; see
//   the model's acquire calls).
TEST(DataParallel, CountedCommunicationEqualsTheFormula) {
  parallel::Comm& world = mpi_world().comm();
  const int D = world.size(), r = world.rank();
  const std::string data = shared_corpus(world);
  for (int zero = 0; zero <= 3; zero++) {
    config::TrainOptions o = options(data, 2, 1, zero, D);
    o.parallel.bucket_mb = 1000;  // one bucket: one all-reduce of the whole gradient
    Trainer t(o, &world);
    t.step();
    parallel::Comm& dp = t.mesh().dp_comm();
    const ParamStore& s = t.params();
    const int64_t P = s.total_numel();
    uint64_t ar = 0, rs = 0, ag_params = 0;
    if (zero <= 1) ar = parallel::all_reduce_sent_bytes(size_t(P), 4, D, r);
    if (zero >= 2) rs = uint64_t(D - 1) * uint64_t(P / D) * 4;
    if (zero == 1 || zero == 2) ag_params = uint64_t(D - 1) * uint64_t(P / D) * 4;
    if (zero == 3) {
      // Uses per step: embeddings in encoder fwd, classifier, encoder bwd (3); each layer and the
      // final norm fwd + bwd (2: a stage call releases its units, model/gpt_stage.cpp).
      for (int u = 0; u < s.num_units(); u++) {
        const int uses = u == 0 ? 3 : 2;
        ag_params += uint64_t(uses) * uint64_t(D - 1) * uint64_t(s.units()[size_t(u)].size() / D) * 4;
      }
    }
    // Stages 0-2 (D > 1): the embeddings' sparse gradient goes as rows, all-gathered after backward:
    // for wte and wpe, N = B*T row ids and N x C values per rank.
    const uint64_t N = 2 * 16, C = 32;
    const uint64_t rows = (D > 1 && zero <= 2) ? 2 * uint64_t(D - 1) * (N * 4 + N * C * 4) : 0;
    // Small scalars on top, gathered as 8-byte doubles ((N-1) x 8 bytes each): the loss sum; for
    // stages >= 1 the squared norm; with D > 1 and stages 0-2 the noise-scale norms (the local one,
    // and for stages 1-2 the global one without the embeddings).
    const int doubles = 1 + (zero >= 1 ? 1 : 0) + (D > 1 && zero < 3 ? 1 : 0) + (D > 1 && (zero == 1 || zero == 2) ? 1 : 0);
    const auto& c = dp.counters();
    EXPECT_EQ(c[parallel::CommOp::all_reduce].sent_bytes, ar) << "zero=" << zero;
    EXPECT_EQ(c[parallel::CommOp::reduce_scatter].sent_bytes, rs) << "zero=" << zero;
    EXPECT_EQ(c[parallel::CommOp::all_gather].sent_bytes, ag_params + rows + uint64_t(doubles) * (D - 1) * 8)
        << "zero=" << zero;
    if (r == 0)
      std::printf("dp=%d zero=%d bytes/step: all-reduce %llu, reduce-scatter %llu, all-gather %llu (P = %lld floats)\n",
                  D, zero, (unsigned long long)c[parallel::CommOp::all_reduce].sent_bytes,
                  (unsigned long long)c[parallel::CommOp::reduce_scatter].sent_bytes,
                  (unsigned long long)c[parallel::CommOp::all_gather].sent_bytes, (long long)P);
  }
}

TEST(DataParallel, StateSavedUnderOneLayoutResumesUnderAnother) {
  parallel::Comm& world = mpi_world().comm();
  const int D = world.size();
  const std::string data = shared_corpus(world);
  // Uninterrupted single-rank reference of the same global batch, on every rank.
  config::TrainOptions ro = options(data, 2 * D, 1, 0, 1);
  ro.steps = 10;
  Trainer ref(ro);
  std::vector<double> want;
  for (int i = 0; i < ro.steps; i++) want.push_back(ref.step().loss);
  // Train 5 steps at dp=D with ZeRO-3, save, resume at dp=D with ZeRO-1 and continue.
  char path[256] = {};
  if (world.rank() == 0) std::snprintf(path, sizeof path, "%s/ckpt", make_temp_dir("mt_dp_state").c_str());
  world.broadcast(path, sizeof path / 4, DType::i32, 0);
  {
    config::TrainOptions o = options(data, 2, 1, 3, D);
    o.steps = 10;
    Trainer t(o, &world);
    for (int i = 0; i < 5; i++) t.step();
    t.save_state(path);
  }
  world.barrier();
  config::TrainOptions o = options(data, 2, 1, 1, D);
  o.steps = 10;
  o.resume = path;
  Trainer t(o, &world);
  double err = 0;
  for (int i = 5; i < 10; i++) err = std::max(err, std::fabs(t.step().loss - want[size_t(i)]) / want[size_t(i)]);
  if (world.rank() == 0) std::printf("resume zero=3 -> zero=1 at dp=%d: max rel loss err %.2e\n", D, err);
  EXPECT_LE(err, 1e-5);
  if (D != 4) return;
  // The dp=4 ZeRO-3 checkpoint also resumes at dp=2 ZeRO-1 (ranks 0-1), at dp=1 ZeRO-0 (rank 2) and
  // at dp=1 ZeRO-3 (rank 3), with the same global batch: the same losses as the uninterrupted run,
  // so the data sequence continued without a duplicate or a gap.
  const int color = world.rank() < 2 ? 0 : world.rank() - 1;
  std::unique_ptr<parallel::Comm> group = world.split(color, world.rank(), "resume_group");
  const int gd = group->size();
  config::TrainOptions go = options(data, 2 * D / gd, 1, color == 0 ? 1 : (color == 1 ? 0 : 3), gd);
  go.steps = 10;
  go.resume = path;
  Trainer g(go, group.get());
  double gerr = 0;
  for (int i = 5; i < 10; i++) gerr = std::max(gerr, std::fabs(g.step().loss - want[size_t(i)]) / want[size_t(i)]);
  if (group->rank() == 0)
    std::printf("resume dp=4 zero=3 -> dp=%d zero=%d: max rel loss err %.2e\n", gd, go.parallel.zero, gerr);
  EXPECT_LE(gerr, 1e-5);
}

// A run resumed on fewer ranks without global_batch keeps the checkpoint's global batch (batch_size
// grows to make it up), so it continues the uninterrupted run's losses; where dp x grad_accum does
// not divide it, an error says so; a global_batch the user gives is theirs.
TEST(DataParallel, ResumeOnFewerRanksKeepsTheGlobalBatch) {
  parallel::Comm& world = mpi_world().comm();
  const int D = world.size();
  const std::string data = shared_corpus(world);
  config::TrainOptions ro = options(data, 2 * D, 1, 0, 1);
  ro.steps = 8;
  Trainer ref(ro);
  std::vector<double> want;
  for (int i = 0; i < ro.steps; i++) want.push_back(ref.step().loss);
  char path[256] = {};
  if (world.rank() == 0) std::snprintf(path, sizeof path, "%s/ckpt", make_temp_dir("mt_dp_batch").c_str());
  world.broadcast(path, sizeof path / 4, DType::i32, 0);
  {
    config::TrainOptions o = options(data, 2, 1, 1, D);
    o.steps = 8;
    Trainer t(o, &world);
    for (int i = 0; i < 4; i++) t.step();
    t.save_state(path);
  }
  world.barrier();
  // Rank 0 alone, and the other ranks together: each group resumes with the same batch_size as before.
  std::unique_ptr<parallel::Comm> group = world.split(world.rank() == 0 ? 0 : 1, world.rank(), "fewer");
  const int gd = group->size();
  config::TrainOptions go = options(data, 2, 1, 0, gd);
  go.steps = 8;
  go.resume = path;
  if ((2 * D) % gd != 0) {
    try {
      Trainer g(go, group.get());
      ADD_FAILURE() << "a global batch of " << 2 * D << " rows was changed on dp " << gd;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("global batch of " + std::to_string(2 * D) + " rows on dp " +
                                           std::to_string(D) + "; on dp " + std::to_string(gd)),
                std::string::npos) << e.what();
    }
    return;
  }
  {
    Trainer g(go, group.get());
    EXPECT_EQ(g.options().batch_size, 2 * D / gd);
    double err = 0;
    for (int i = 4; i < 8; i++) err = std::max(err, std::fabs(g.step().loss - want[size_t(i)]) / want[size_t(i)]);
    if (group->rank() == 0) std::printf("resume dp=%d -> dp=%d, the global batch kept: max rel loss err %.2e\n", D, gd, err);
    EXPECT_LE(err, 1e-5);
  }
  go.global_batch = 2 * gd;  // the user's choice: another global batch
  Trainer g(go, group.get());
  EXPECT_EQ(g.options().batch_size, 2);
}

// On GPUs the gradient and parameter collectives go over a device communicator (NCCL) and only scalars
// over the host one. The same split on CPUs, with a second MPI communicator of the dp group standing
// in for NCCL: it must carry every gradient and parameter byte of the formula, the host communicator
// none of them (only scalars and the embeddings' rows, a host-only optimisation), and the reduced
// gradients must be bitwise those of the one-communicator run.
TEST(DataParallel, TensorCollectivesGoOverTheDeviceCommunicator) {
  parallel::Comm& world = mpi_world().comm();
  const int D = world.size(), r = world.rank();
  model::GPTConfig cfg;
  cfg.vocab_size = 64;
  cfg.block_size = 16;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_embd = 32;
  const int B = 2, T = 16;
  std::mt19937_64 rng(shared_seed() + uint64_t(r));  // a different micro-batch on every rank
  std::vector<int32_t> tokens(size_t(B * T)), targets(size_t(B * T));
  for (auto& t : tokens) t = int32_t(rng() % 63);
  for (auto& t : targets) t = int32_t(rng() % 63);
  const model::MicroBatch mb{B, T, tokens.data(), targets.data(), nullptr, nullptr};
  // One step's reduced gradient shard, and the communicators' byte counters.
  struct Run {
    std::vector<float> grads;
    parallel::CommCounters host, tensors;
  };
  auto run = [&](int zero, bool separate) {
    std::unique_ptr<parallel::Comm> host = world.split(0, r, "host");
    std::unique_ptr<parallel::Comm> tensors = separate ? world.split(0, r, "tensors") : nullptr;
    Arena arena;
    ParamStore store;
    model::GPT gpt(cfg, store);
    store.finalize(arena, DType::f32, D, parallel::storage_for_zero(zero));
    gpt.init_weights(5);
    gpt.set_arena(&arena);
    parallel::DataParallelOptions o;
    o.zero = zero;
    o.bucket_bytes = 4096;  // several buckets
    parallel::DataParallel dp(store, *host, arena, o, ops::Ctx{}, tensors.get());
    gpt.set_unit_hooks(&dp);
    dp.begin_step();
    dp.set_last_micro(true);
    gpt.forward_backward(mb, 1.f / float(B * T * D));
    dp.finish_grads();
    EXPECT_TRUE(dp.grads_finite());
    (void)dp.grad_sum_squares();
    dp.publish_params();
    Run res;
    res.grads.assign(dp.grad_shard(), dp.grad_shard() + dp.shard_numel());
    res.host = host->counters();
    if (tensors) res.tensors = tensors->counters();
    return res;
  };
  for (int zero = 0; zero <= 3; zero++) {
    const Run one = run(zero, false), two = run(zero, true);
    ASSERT_EQ(one.grads.size(), two.grads.size());
    EXPECT_EQ(0, std::memcmp(one.grads.data(), two.grads.data(), one.grads.size() * 4)) << "zero=" << zero;
    using parallel::CommOp;
    // The host communicator keeps only its scalars (the overflow flag's all-reduce; norms, and the
    // embeddings' rows, as all-gathers); every gradient and parameter byte moved to the second one.
    const uint64_t flag = zero >= 1 ? parallel::all_reduce_sent_bytes(1, 4, D, r) : 0;
    EXPECT_EQ(two.host[CommOp::all_reduce].sent_bytes, flag) << "zero=" << zero << ": only the overflow flag";
    EXPECT_EQ(two.tensors[CommOp::all_reduce].sent_bytes + flag, one.host[CommOp::all_reduce].sent_bytes)
        << "zero=" << zero;
    EXPECT_EQ(two.tensors[CommOp::reduce_scatter].sent_bytes, one.host[CommOp::reduce_scatter].sent_bytes)
        << "zero=" << zero;
    EXPECT_EQ(two.host[CommOp::reduce_scatter].sent_bytes, 0u) << "zero=" << zero;
    EXPECT_EQ(two.host[CommOp::all_gather].sent_bytes + two.tensors[CommOp::all_gather].sent_bytes,
              one.host[CommOp::all_gather].sent_bytes)
        << "zero=" << zero;
    if (D > 1 && zero >= 1) {
      EXPECT_GT(two.tensors[CommOp::all_gather].sent_bytes, 0u) << "parameters gathered there";
    }
  }
}

TEST(DataParallel, SdcCheckNamesTheCorruptedReplica) {
  parallel::Comm& world = mpi_world().comm();
  const int D = world.size();
  if (D < 3) GTEST_SKIP() << "a corrupted replica can only be told apart with at least 3 replicas";
  const std::string data = shared_corpus(world);
  config::TrainOptions o = options(data, 2, 1, 0, D);
  o.parallel.sdc_every = 2;
  o.parallel.sdc_flip_step = 6;
  o.parallel.sdc_flip_rank = D - 1;
  Trainer t(o, &world);
  for (int i = 0; i < 4; i++) t.step();  // checks after steps 2 and 4 pass
  try {
    t.step();
    t.step();  // the check after step 6 sees the bit flipped on the last rank
    ADD_FAILURE() << "no SDC error";
  } catch (const parallel::CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("data-parallel rank " + std::to_string(D - 1)), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::testing
