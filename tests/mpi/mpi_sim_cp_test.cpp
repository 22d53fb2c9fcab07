// Context parallelism on the (simulated) device, two ranks (parallel/ring_attention.h):
//   - ring attention with its blocks on the cp group's NCCL communicator gives the CPU ring's outputs,
//     lse and gradients (fp32, within 1e-5) and skips the same block pairs, one of them hidden by a
//     document; its key/value blocks and gradients go over NCCL and its document ids over the host
//     communicator, each side's bytes those of the header's formula;
//   - a cp2 training run on the device follows the single-rank CPU run of the same batch (packed
//     documents, the document mask on) within the fp32 bounds, its steps make no device-wide wait, the
//     cp group's bytes per step are the formula's, and NCCL connected the cp ring's peers at start-up;
//   - mixture layers under cp2 x ep2 on the device follow the single-rank CPU run, dropless and with drops.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "parallel/nccl_comm.h"
#include "parallel/ring_attention.h"
#include "plan/memory.h"
#include "sim/nccl_connections.h"
#include "sim/sim.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/mpi_train_util.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::testing {
namespace {

using parallel::Comm;
using parallel::RingAttention;
using parallel::RingStats;
using parallel::Zigzag;

constexpr size_t sz(int64_t n) { return static_cast<size_t>(n); }

// One rank's ring: its zigzag rows of the inputs in, outputs, lse, dqkv and the block counts out.
struct RingRun {
  std::vector<float> out, lse, dqkv;
  RingStats fwd, bwd;
};

struct Shape {
  int B, T, C, NH;
};

// Runs this rank's rows through ring attention, on the host (blocks == nullptr: the host communicator
// carries everything) or on the device (blocks: the NCCL communicator; arrays uploaded to `arena`).
RingRun run_ring(Comm& cp, Comm* blocks, Arena* arena, const std::vector<float>& qkv, const std::vector<float>& dout,
                 const std::vector<int32_t>& doc, const Shape& c) {
  const Zigzag z{c.T, cp.size(), cp.rank()};
  const int Tl = z.local_len();
  std::vector<float> lq(sz(c.B) * Tl * 3 * c.C), ld(sz(c.B) * Tl * c.C);
  std::vector<int32_t> ldoc(sz(c.B) * Tl);
  z.take(lq.data(), qkv.data(), c.B, 3 * c.C);
  z.take(ld.data(), dout.data(), c.B, c.C);
  z.take(ldoc.data(), doc.data(), c.B, 1);
  RingRun r;
  r.out.resize(ld.size());
  r.lse.resize(sz(c.B) * c.NH * Tl);
  r.dqkv.resize(lq.size());
  if (!blocks) {
    const RingAttention ring(cp);
    const ops::Ctx ctx;
    r.fwd = ring.forward(r.out.data(), r.lse.data(), lq.data(), ldoc.data(), ldoc.data(), c.B, Tl, c.C, c.NH, ctx);
    r.bwd = ring.backward(r.dqkv.data(), ld.data(), lq.data(), r.out.data(), r.lse.data(), ldoc.data(), ldoc.data(),
                          c.B, Tl, c.C, c.NH, ctx);
    return r;
  }
  const ops::Ctx ctx{Device::cuda, nullptr};
  auto on_device = [&](const void* host, size_t bytes) {
    Buffer b = arena->alloc(MemCategory::activations, bytes);
    if (host) arena->mem().upload(b.data(), host, bytes);
    return b;
  };
  Buffer q = on_device(lq.data(), lq.size() * 4), d = on_device(ld.data(), ld.size() * 4),
         ids = on_device(ldoc.data(), ldoc.size() * 4), out = on_device(nullptr, r.out.size() * 4),
         lse = on_device(nullptr, r.lse.size() * 4), dqkv = on_device(nullptr, r.dqkv.size() * 4);
  const RingAttention ring(cp, arena, blocks);
  r.fwd = ring.forward(out.f32(), lse.f32(), q.f32(), ids.i32(), ldoc.data(), c.B, Tl, c.C, c.NH, ctx);
  r.bwd = ring.backward(dqkv.f32(), d.f32(), q.f32(), out.f32(), lse.f32(), ids.i32(), ldoc.data(), c.B, Tl, c.C,
                        c.NH, ctx);
  arena->mem().download(r.out.data(), out.data(), r.out.size() * 4);
  arena->mem().download(r.lse.data(), lse.data(), r.lse.size() * 4);
  arena->mem().download(r.dqkv.data(), dqkv.data(), r.dqkv.size() * 4);
  return r;
}

TEST(CpOnTheDevice, RingAttentionOverNcclIsTheHostRing) {
  Comm& world = mpi_world().comm();
  if (const std::string missing = gpus_missing(world.size()); world.size() != 2 || !missing.empty())
    GTEST_SKIP() << "needs 2 ranks with a (simulated) GPU each";
  cuda::set_device(0);
  std::mt19937_64 rng(shared_seed() + 3);
  const int P = world.size();
  const Shape c{2, 2 * 5 * P, 16, 2};
  const int chunk = c.T / (2 * P);
  // As in mpi_ring_attention_test.cpp: document 0 is chunk 0 exactly in both rows, so rank 0's keys are
  // hidden from rank 1 (chunk 0 by the document, chunk 3 by causality) and rank 1 skips that pair.
  std::vector<int32_t> doc(sz(c.B) * c.T);
  for (int t = 0; t < c.T; t++) {
    doc[sz(t)] = t < chunk ? 0 : 1;
    doc[sz(c.T + t)] = t < chunk ? 0 : 1 + (t + chunk / 2) / chunk;
  }
  const auto qkv = random_floats(sz(c.B) * c.T * 3 * c.C, rng, -2.f, 2.f);
  const auto dout = random_floats(sz(c.B) * c.T * c.C, rng);
  const RingRun want = run_ring(world, nullptr, nullptr, qkv, dout, doc, c);
  parallel::NcclComm nccl(world, nullptr, "cp.nccl");
  Arena arena(cuda::device_memory());
  world.reset_counters();
  const uint64_t syncs = sim::device_synchronizations();
  const RingRun got = run_ring(world, &nccl, &arena, qkv, dout, doc, c);
  EXPECT_EQ(sim::device_synchronizations(), syncs) << "the ring synchronised the whole device";
  EXPECT_LT(max_rel_error(got.out.data(), want.out.data(), want.out.size(), 1e-6), 1e-5);
  EXPECT_LT(max_rel_error(got.lse.data(), want.lse.data(), want.lse.size(), 1e-6), 1e-5);
  EXPECT_LT(max_rel_error(got.dqkv.data(), want.dqkv.data(), want.dqkv.size(), 1e-6), 1e-5);
  EXPECT_EQ(got.fwd.skipped, world.rank() == 1 ? 1 : 0);
  EXPECT_EQ(got.fwd.computed, want.fwd.computed);
  EXPECT_EQ(got.bwd.skipped, want.bwd.skipped);
  // The header's bytes, split by communicator: blocks and gradients on NCCL, document ids on the host.
  const uint64_t Nl = uint64_t(c.B) * c.T / P, kv = Nl * 2 * c.C * 4;
  EXPECT_EQ(nccl.counters().total_sent_bytes(), (P - 1) * kv + (P - 1) * kv + P * kv);
  EXPECT_EQ(world.counters().total_sent_bytes(), 2 * (P - 1) * Nl * 4);
}

// The tiny model on packed documents with the mask, seq_len 16 (chunks of 4 tokens at cp 2).
config::TrainOptions options(const std::string& data, std::vector<std::string> args, int steps) {
  for (const char* a : {"attention=flash", "data.doc_mask=true", "data.mode=shuffled", "optim.eps=1e-6"})
    args.push_back(a);
  return tiny_on_device(data, std::move(args), steps);
}

TEST(CpOnTheDevice, TrainingFollowsTheSingleRankCpuRun) {
  Comm& world = mpi_world().comm();
  const std::string data = two_gpu_corpus(world);
  if (data.empty()) GTEST_SKIP() << "needs 2 ranks with a (simulated) GPU each";
  const int steps = 3;
  config::TrainOptions ro = options(data, {}, steps);
  ro.device = Device::cpu;
  train::Trainer ref(ro);
  const Curve want = train_curve(ref, steps);

  const config::TrainOptions o = options(data, {"parallel.cp=2", "parallel.dp=1"}, steps);
  ASSERT_EQ(sim::nccl::connections(), sim::nccl::Connections{}) << "a communicator of an earlier test is still live";
  train::Trainer t(o, &world, world.rank());
  // NCCL connected the cp ring's peer (and the cp x dp gradients' collectives) before step 1, as the
  // planner counts them.
  const sim::nccl::Connections built = sim::nccl::connections();
  const plan::NcclConnections planned = plan::plan_nccl_connections(o, t.mesh().layout(), 0);
  EXPECT_EQ(built.peers, 1);
  EXPECT_EQ(built.peers, planned.peers);
  EXPECT_EQ(built.rings, planned.rings);
  Curve got;
  for (int i = 0; i < steps; i++) {
    const uint64_t syncs = sim::device_synchronizations();
    const train::StepResult r = t.step();
    EXPECT_EQ(sim::device_synchronizations(), syncs) << "step " << i + 1 << " synchronised the whole device";
    got.loss.push_back(r.loss);
    got.norm.push_back(r.grad_norm);
  }
  EXPECT_EQ(sim::nccl::connections(), built) << "a step connected more than start-up did";
  got.weights = t.global_master();
  const double loss_err = max_rel(got.loss, want.loss), werr = weight_err(got.weights, want.weights);
  if (world.rank() == 0)
    std::printf("cp2 on the device vs one CPU rank: loss max rel err %.2e, weights %.2e\n", loss_err, werr);
  EXPECT_LE(loss_err, kDeviceLossTol);
  EXPECT_LE(werr, kDeviceWeightTol);
  // The last step's cp traffic: ring attention's formula (fp32, 2 layers, forward and backward).
  const uint64_t P = 2, Nl = uint64_t(o.batch_size) * o.seq_len / P, kv = Nl * 2 * o.model.n_embd * 4,
                 ids = (P - 1) * Nl * 4;
  const uint64_t per_layer = ((P - 1) * kv + ids) + ((P - 1) * kv + P * kv + ids);
  EXPECT_EQ(t.group_counters(parallel::MeshDim::cp).total_sent_bytes(), o.model.n_layer * per_layer);
}

// Mixture layers under cp2 x ep2 on the device (each cp rank routes its chunks' tokens; the balance
// term and the drops over the whole micro-batch, moe/token_group.h; the rows over ep's NCCL
// communicator) against the single-rank CPU run: dropless with the aux term, and with a capacity that
// drops. The same assignments routed and dropped, step by step.
TEST(CpOnTheDevice, MixtureLayersUnderCpAndEpFollowTheSingleRankCpuRun) {
  Comm& world = mpi_world().comm();
  const std::string data = two_gpu_corpus(world);
  if (data.empty()) GTEST_SKIP() << "needs 2 ranks with a (simulated) GPU each";
  const int steps = 3;
  for (const char* capacity : {"moe.capacity=0", "moe.capacity=1.0"}) {
    const std::vector<std::string> moe = {"model=tiny-moe", "moe.every=1", "moe.shared=1", "moe.balance=aux",
                                          "moe.aux_coef=0.05", capacity};
    config::TrainOptions ro = options(data, moe, steps);
    ro.device = Device::cpu;
    train::Trainer ref(ro);
    std::vector<std::string> args = moe;
    for (const char* a : {"parallel.cp=2", "parallel.dp=1", "parallel.ep=2"}) args.push_back(a);
    train::Trainer t(options(data, args, steps), &world, world.rank());
    Curve want, got;
    const double dropped = step_beside(ref, t, steps, want, got, capacity);
    if (std::string(capacity) != "moe.capacity=0") {
      EXPECT_GT(dropped, 0) << capacity << ": nothing dropped";
    }
    got.weights = t.global_master();
    want.weights = ref.global_master();
    const double loss_err = max_rel(got.loss, want.loss), werr = weight_err(got.weights, want.weights);
    if (world.rank() == 0)
      std::printf("moe cp2 x ep2 on the device (%s) vs one CPU rank: loss max rel err %.2e, weights %.2e\n",
                  capacity, loss_err, werr);
    EXPECT_LE(loss_err, kDeviceLossTol) << capacity;
    EXPECT_LE(werr, kDeviceWeightTol) << capacity;
  }
}

}  // namespace
}  // namespace mt::testing
