// Pipeline parallelism on GPUs: activations, their gradients and the tied embedding's gradient travel
// over an NCCL communicator of the pp group, grouped into exchanges at each exchange point
// (parallel/pipeline_exchange.h), the last stage's losses stay on the device until the step's end,
// and the bubble is timed with CUDA events. Each layout's GPU run is held against the same layout on
// the CPU (fp32: the backends differ by rounding only). One GPU per rank (a single node: rank r
// drives GPU r), so these skip where a build has no CUDA or a machine has fewer GPUs than ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/mpi_train_util.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::testing {
namespace {

using config::TrainOptions;
using train::Trainer;

struct Layout {
  int pp = 2, dp = 1, zero = 0, accum = 4, virt = 1;
  const char* schedule = "1f1b";
  const char* attention = "materialized";
  std::string str() const {
    return strfmt("pp=%d %s v=%d dp=%d zero=%d accum=%d attention=%s", pp, schedule, virt, dp, zero, accum, attention);
  }
};

config::TrainOptions options(const std::string& data, const Layout& l, int steps, Device device) {
  config::TrainOptions o = config::parse_train_options(
      {"model=tiny", "model.vocab_size=64", "model.n_layer=" + std::to_string(std::max(2, l.pp * l.virt)),
       "model.n_embd=32", "model.n_head=4",
       "model.block_size=16", "seq_len=16", "batch_size=2", "optim.lr=3e-3", "optim.warmup_steps=3",
       "optim.eps=1e-6", "data.mode=shuffled", "threads=1", "data.prefetch=0", "data.path=" + data,
       "parallel.dp=" + std::to_string(l.dp), "parallel.pp=" + std::to_string(l.pp),
       std::string("pp.schedule=") + l.schedule, "pp.virtual=" + std::to_string(l.virt),
       std::string("attention=") + l.attention, "grad_accum=" + std::to_string(l.accum),
       "steps=" + std::to_string(steps)});
  o.parallel.zero = l.zero;
  o.device = device;
  return o;
}

TEST(PipelineParallelGpu, EveryScheduleMatchesTheCpuRun) {
  parallel::Comm& world = mpi_world().comm();
  const int W = world.size();
  const std::string missing = gpus_missing(W);
  if (!missing.empty()) GTEST_SKIP() << missing;
  const std::string data = shared_corpus(world);
  const int steps = 4;  // past the warm-up; the simulated device runs each step on the warp emulator
  std::vector<Layout> ls = {{.pp = W, .schedule = "gpipe"},
                            {.pp = W, .schedule = "1f1b"},
                            {.pp = W, .schedule = "zb1"},
                            {.pp = W, .accum = 2, .schedule = "1f1b", .attention = "flash"},
                            // The smallest interleaved schedule that deadlocked when each compute action's
                            // messages were paired on their own (p 2, m 4, v 2).
                            {.pp = W, .accum = W == 2 ? 4 : 2 * W, .virt = 2, .schedule = "interleaved"}};
  if (W == 4) ls.push_back({.pp = 2, .dp = 2, .zero = 1, .schedule = "1f1b"});  // with dp's NCCL communicator
  for (const Layout& l : ls) {
    Trainer cpu(options(data, l, steps, Device::cpu), &world);
    const Curve want = train_curve(cpu, steps);
    Trainer gpu(options(data, l, steps, Device::cuda), &world, world.rank());
    const Curve got = train_curve(gpu, steps);
    const double loss_err = max_rel(got.loss, want.loss), werr = weight_err(got.weights, want.weights);
    if (world.rank() == 0)
      std::printf("%s on GPUs vs CPU: loss max rel err %.2e, weights %.2e\n", l.str().c_str(), loss_err, werr);
    EXPECT_LE(loss_err, kDeviceLossTol) << l.str();
    EXPECT_LE(werr, kDeviceWeightTol) << l.str();
    EXPECT_TRUE(tied_copies_equal(gpu)) << l.str() << ": the two copies of wte differ on the GPUs";
  }
}

// The measured bubble on GPUs comes from CUDA events: every rank's share in [0, 1), F and B times
// above zero (a host clock around a kernel launch would also be, so the check that matters is that
// the figures exist and add up), and the activations counted on the pp group (its NCCL counters).
TEST(PipelineParallelGpu, MetricsLogTheBubbleFromDeviceTimes) {
  parallel::Comm& world = mpi_world().comm();
  const int W = world.size();
  const std::string missing = gpus_missing(W);
  if (!missing.empty()) GTEST_SKIP() << missing;
  const std::string data = shared_corpus(world);
  char root[256] = {};
  if (world.rank() == 0) std::snprintf(root, sizeof root, "%s", make_temp_dir("mt_pp_gpu_metrics").c_str());
  world.broadcast(root, sizeof root / 4, DType::i32, 0);
  const int steps = 3, accum = 4;
  config::TrainOptions o = options(data, Layout{.pp = W, .accum = accum}, steps, Device::cuda);
  o.out_dir = std::string(root) + "/run";
  Trainer(o, &world, world.rank()).run();
  if (world.rank() != 0) return;
  std::ifstream in(o.out_dir + "/metrics.jsonl");
  int seen = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    seen++;
    ASSERT_TRUE(j.contains("pp") && j.contains("comm_pp")) << line;
    const std::vector<double> ranks = j["pp"]["bubble_ranks"].get<std::vector<double>>();
    ASSERT_EQ(int(ranks.size()), W);
    for (double b : ranks) {
      EXPECT_GE(b, 0.0);
      EXPECT_LT(b, 1.0);
    }
    EXPECT_GT(j["pp"]["forward_s"].get<double>(), 0.0);
    EXPECT_GT(j["pp"]["backward_s"].get<double>(), 0.0);
    const uint64_t activations = uint64_t(accum) * 2 * 16 * 32 * 4;  // m B T C fp32
    EXPECT_GE(j["comm_pp"]["send"]["sent_bytes"].get<uint64_t>(), activations);
  }
  EXPECT_EQ(seen, steps);
}

}  // namespace
}  // namespace mt::testing
