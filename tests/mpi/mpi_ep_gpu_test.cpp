// Expert parallelism on GPUs: the counts go over the ep group's host communicator, the permuted rows
// over its NCCL twin (ep.nccl), staged in device memory and moved into expert order there, and the
// experts held apart reduce over the expert-data group's NCCL communicator. Mixture layers also run under
// the pipeline on the device, zb1's split backward included. Each layout's GPU run is
// held against the same layout on the CPU (fp32: the backends differ by rounding only). One GPU per
// rank (a single node: rank r drives GPU r), so this skips where a build has no CUDA or a machine has
// fewer GPUs than ranks.
#include <gtest/gtest.h>

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

config::TrainOptions options(const std::string& data, int dp, int ep, int zero, double capacity, Device device,
                             int pp = 1, const char* schedule = "1f1b") {
  config::TrainOptions o = config::parse_train_options(
      {"model=tiny-moe", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
       "model.block_size=16", "moe.every=1", "moe.shared=1", "moe.balance=bias", "moe.bias_rate=0.01",
       "seq_len=16", "batch_size=2", "steps=4", "optim.lr=3e-3", "optim.warmup_steps=3", "threads=1",
       "data.prefetch=0", "data.path=" + data});
  o.parallel.dp = dp;
  o.parallel.ep = ep;
  o.parallel.pp = pp;
  o.parallel.pp_schedule = schedule;
  o.grad_accum = pp > 1 ? 4 : 1;
  o.parallel.zero = zero;
  o.model.moe.capacity = capacity;
  o.device = device;
  return o;
}

TEST(ExpertParallelGpu, RowsOverNcclMatchTheCpuRun) {
  parallel::Comm& world = mpi_world().comm();
  const int W = world.size();
  const std::string missing = gpus_missing(W);
  if (!missing.empty()) GTEST_SKIP() << missing;
  const std::string data = shared_corpus(world, 20261202);  // fixed: near-ties may route differently
  const int steps = 4;  // past the warm-up; the simulated device runs each step on the warp emulator
  struct Case {
    int ep, zero;
    double capacity;
  };
  std::vector<Case> cases = {{W, 0, 0.0}, {W, 1, 0.0}, {W, 3, 0.0}, {W, 0, 1.0}};
  if (W == 4) cases.push_back({2, 1, 0.0});  // ep 2 x expert-data 2
  for (const Case& c : cases) {
    const std::string what = strfmt("dp %d ep %d zero %d capacity %.1f", W, c.ep, c.zero, c.capacity);
    Trainer cpu(options(data, W, c.ep, c.zero, c.capacity, Device::cpu), &world);
    const Curve want = train_curve(cpu, steps);
    Trainer gpu(options(data, W, c.ep, c.zero, c.capacity, Device::cuda), &world, world.rank());
    const Curve got = train_curve(gpu, steps);
    const double loss_err = max_rel(got.loss, want.loss), werr = weight_err(got.weights, want.weights);
    if (world.rank() == 0) std::printf("%s on GPUs vs CPU: loss max rel err %.2e, weights %.2e\n", what.c_str(), loss_err, werr);
    EXPECT_LE(loss_err, kDeviceLossTol) << what;
    EXPECT_LE(werr, kDeviceWeightTol) << what;
    EXPECT_EQ(gpu.model().moe_bias(0), cpu.model().moe_bias(0)) << what << ": the routing bias moved differently";
  }
}

// Mixture layers under the pipeline on the device: with zb1 a mixture layer's backward splits into
// B_input (through the combine, experts, router and dispatch) and W (the experts', router's and shared
// expert's weight gradients), both on the device; 1f1b's unsplit backward beside it.
TEST(ExpertParallelGpu, MixtureLayersUnderEachPipelineScheduleMatchTheCpuRun) {
  parallel::Comm& world = mpi_world().comm();
  const int W = world.size();
  const std::string missing = gpus_missing(W);
  if (!missing.empty()) GTEST_SKIP() << missing;
  if (W != 2) GTEST_SKIP() << "two pipeline stages of the two-layer model: 2 ranks";
  const std::string data = shared_corpus(world, 20261202);
  const int steps = 4;
  struct Case {
    const char* schedule;
    double capacity;
  };
  for (const auto& [schedule, capacity] : {Case{"1f1b", 0.0}, Case{"zb1", 0.0}, Case{"zb1", 1.0}}) {
    const std::string what = strfmt("pp 2 %s capacity %.1f", schedule, capacity);
    Trainer cpu(options(data, 1, 1, 0, capacity, Device::cpu, 2, schedule), &world);
    const Curve want = train_curve(cpu, steps);
    Trainer gpu(options(data, 1, 1, 0, capacity, Device::cuda, 2, schedule), &world, world.rank());
    const Curve got = train_curve(gpu, steps);
    const double loss_err = max_rel(got.loss, want.loss), werr = weight_err(got.weights, want.weights);
    if (world.rank() == 0)
      std::printf("%s on GPUs vs CPU: loss max rel err %.2e, weights %.2e\n", what.c_str(), loss_err, werr);
    EXPECT_LE(loss_err, kDeviceLossTol) << what;
    EXPECT_LE(werr, kDeviceWeightTol) << what;
    const int layer = world.rank();  // stage r holds layer r
    EXPECT_EQ(gpu.model().moe_bias(layer), cpu.model().moe_bias(layer)) << what << ": the routing bias moved differently";
  }
}

}  // namespace
}  // namespace mt::testing
