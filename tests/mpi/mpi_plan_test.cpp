// `minitrain plan`'s predictions against a real Trainer's measurements, on every rank: for each
// layout of the tiny model (dense, and with a mixture layer) the plan's params, grads and optimizer bytes equal the arena's per-step
// peaks exactly (ZeRO 2-3's gradient buffers: within the range MPI's progress allows), its
// activations are within 5%, and its bytes per step on each group (dp, tp, cp, pp) equal the
// communicators' counters op by op.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "parallel/mesh.h"
#include "plan/cost.h"
#include "plan/memory.h"
#include "tests/mpi/mpi_train_util.h"

namespace mt::train {
namespace {

using mt::testing::mpi_world;
using mt::testing::shared_corpus;
using mt::testing::expect_same_bytes;

struct Layout {
  int dp = 1, tp = 1, pp = 1, cp = 1, zero = 0, accum = 1;
  const char* recompute = "none";
  const char* precision = "fp32";
  bool moe = false;  // tiny-moe: layer 1 a mixture of 4 experts (top-2) with a shared expert, dropless
  const char* schedule = "1f1b";
  std::string str() const {
    return strfmt("dp=%d tp=%d pp=%d cp=%d zero=%d accum=%d recompute=%s %s%s %s", dp, tp, pp, cp, zero, accum,
                  recompute, precision, moe ? " moe" : "", pp > 1 ? schedule : "");
  }
};

config::TrainOptions options(const std::string& data, const Layout& l) {
  config::TrainOptions o = config::parse_train_options(
      {l.moe ? "model=tiny-moe" : "model=tiny", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
       "model.block_size=16", "seq_len=16", "batch_size=2", "threads=1", "data.prefetch=0", "data.path=" + data,
       "dp=" + std::to_string(l.dp), "tp=" + std::to_string(l.tp), "pp=" + std::to_string(l.pp),
       "cp=" + std::to_string(l.cp), "zero=" + std::to_string(l.zero), "grad_accum=" + std::to_string(l.accum),
       std::string("recompute=") + l.recompute, std::string("precision=") + l.precision,
       std::string("attention=") + (l.cp > 1 ? "flash" : "auto"), std::string("pp.schedule=") + l.schedule,
       "steps=3"});
  if (l.moe) o.model.moe.shared = 1;
  return o;
}

std::vector<Layout> layouts(int W) {
  std::vector<Layout> out;
  auto add = [&](Layout l) {
    if (l.dp * l.tp * l.pp * l.cp == W) out.push_back(l);
  };
  for (int zero = 0; zero <= 3; zero++) add({.dp = 2, .zero = zero});
  add({.dp = 2, .zero = 1, .recompute = "full", .precision = "bf16"});
  add({.dp = 2, .zero = 2, .accum = 2});
  add({.dp = 2, .zero = 3, .accum = 2, .precision = "bf16"});
  add({.dp = 2, .zero = 0, .accum = 2, .recompute = "selective", .precision = "fp16"});
  add({.tp = 2});
  add({.tp = 2, .recompute = "selective"});
  add({.tp = 2, .accum = 2, .recompute = "full", .precision = "bf16"});
  add({.pp = 2, .accum = 2});
  add({.cp = 2});
  add({.cp = 2, .recompute = "full"});
  add({.cp = 2, .zero = 1, .accum = 2});
  for (int zero = 0; zero <= 3; zero++) add({.dp = 4, .zero = zero});
  add({.dp = 2, .tp = 2});
  add({.dp = 2, .pp = 2, .accum = 2});
  add({.dp = 2, .cp = 2});
  add({.dp = 2, .tp = 2, .zero = 3, .precision = "bf16"});
  add({.tp = 2, .pp = 2, .accum = 2});
  add({.tp = 4});
  // Mixture layers beside dense ones: not split over tp (no MLP collective; partial gradients under
  // sp), with their buffers in the activations.
  add({.dp = 2, .moe = true});
  add({.tp = 2, .moe = true});
  add({.tp = 2, .accum = 2, .recompute = "full", .precision = "bf16", .moe = true});
  add({.pp = 2, .accum = 2, .moe = true});
  add({.tp = 2, .pp = 2, .accum = 2, .moe = true});
  add({.dp = 2, .tp = 2, .zero = 1, .recompute = "selective", .moe = true});
  // zb1: a micro-batch between its B and its W holds what W reads (model/gpt_stage.cpp).
  add({.pp = 2, .accum = 4, .schedule = "zb1"});
  add({.pp = 2, .accum = 4, .recompute = "full", .schedule = "zb1"});
  add({.pp = 2, .accum = 4, .precision = "bf16", .moe = true, .schedule = "zb1"});
  add({.pp = 2, .accum = 4, .recompute = "selective", .moe = true, .schedule = "zb1"});
  add({.tp = 2, .pp = 2, .accum = 4, .moe = true, .schedule = "zb1"});
  return out;
}

TEST(Plan, PredictionsEqualTheTrainersMeasurements) {
  parallel::Comm& world = mpi_world().comm();
  const std::string data = shared_corpus(world);
  const std::vector<Layout> ls = layouts(world.size());
  if (ls.empty()) GTEST_SKIP() << "no layout for " << world.size() << " ranks";
  for (const Layout& l : ls) {
    const config::TrainOptions o = options(data, l);
    Trainer t(o, &world);
    t.step();  // the first step allocates what later steps reuse
    t.arena().reset_peaks();
    t.step();
    const MemStats& m = t.arena().stats();
    const parallel::MeshLayout pl{.dp = l.dp, .pp = l.pp, .cp = l.cp, .tp = l.tp};
    const int pp_rank = t.mesh().coord(parallel::MeshDim::pp);
    const plan::MemoryPlan mp = plan::plan_memory(t.options(), pl, pp_rank);
    const std::string what = l.str() + strfmt(" rank %d", world.rank());
    for (MemCategory c : {MemCategory::params, MemCategory::grads, MemCategory::optimizer}) {
      if (c != MemCategory::grads || l.zero < 2) {
        EXPECT_EQ(mp.bytes[size_t(c)], m.peak[size_t(c)]) << what << ": " << mem_category_name(c);
      }
    }
    // ZeRO 2-3's unit gradient buffers live until their reduce-scatter completes, which depends on
    // MPI's progress: the peak lies between every reduction completing at once and the bound of two
    // in flight (the plan's own figure, each completing during the next unit's backward, is between).
    const size_t g = m.peak[size_t(MemCategory::grads)];
    if (l.zero >= 2) {
      EXPECT_GE(g, mp.grads_least) << what;
      EXPECT_LE(mp.grads_least, mp.bytes[size_t(MemCategory::grads)]) << what;
      EXPECT_LE(mp.bytes[size_t(MemCategory::grads)], mp.grads_bound) << what;
      EXPECT_LE(g, mp.grads_bound) << what;
    }
    const double act = double(m.peak[size_t(MemCategory::activations)]);
    const double pred = double(mp.bytes[size_t(MemCategory::activations)]);
    EXPECT_NEAR(pred, act, 0.05 * act) << what << ": activations";
    const plan::CommPlan cp = plan::plan_comm(t.options(), pl, pp_rank);
    if (l.dp * l.cp > 1) expect_same_bytes(t.group_counters(parallel::MeshDim::dp), cp.dp, what + " dp");
    if (l.tp > 1) expect_same_bytes(t.group_counters(parallel::MeshDim::tp), cp.tp, what + " tp");
    if (l.cp > 1) expect_same_bytes(t.group_counters(parallel::MeshDim::cp), cp.cp, what + " cp");
    if (l.pp > 1) expect_same_bytes(t.group_counters(parallel::MeshDim::pp), cp.pp, what + " pp");
    if (world.rank() == 0 || l.pp > 1)
      std::printf("%s: params %zu grads %zu optimizer %zu activations %zu (planned %llu, %+.1f%%) comm %zu (planned %llu)\n",
                  what.c_str(), m.peak[0], m.peak[1], m.peak[2], m.peak[3],
                  (unsigned long long)mp.bytes[3], 100.0 * (pred - act) / act, m.peak[4],
                  (unsigned long long)mp.bytes[4]);
  }
}

// Expert parallelism holds each rank's E/ep routed experts apart, sharded over the expert-data group:
// on every ZeRO stage the plan's model-state bytes and the dp group's bytes per step (the experts'
// over the expert-data group included) equal the trainer's for ep 1, 2 and (4 ranks) 4, and
// the params bytes a rank saves against ep 1 are the experts it no longer stores (fp32, ZeRO-0: every
// byte of them, 1 - 1/ep of the experts' 4 bytes per parameter, up to the units' padding).
TEST(Plan, ExpertParallelModelStateEqualsTheTrainers) {
  parallel::Comm& world = mpi_world().comm();
  const int W = world.size();
  if (W != 2 && W != 4) GTEST_SKIP();
  const std::string data = shared_corpus(world);
  for (int zero = 0; zero <= 3; zero++) {
    uint64_t params_ep1 = 0;
    for (int ep = 1; ep <= W; ep *= 2) {
      const config::TrainOptions o = config::parse_train_options(
          {"model=tiny-moe", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
           "model.block_size=16", "moe.every=1", "moe.shared=1", "seq_len=16", "batch_size=2", "threads=1",
           "data.prefetch=0", "data.path=" + data, "dp=" + std::to_string(W), "ep=" + std::to_string(ep),
           "zero=" + std::to_string(zero), "grad_accum=" + std::to_string(zero >= 2 ? 2 : 1), "steps=3"});
      Trainer t(o, &world);
      t.step();
      t.arena().reset_peaks();
      t.step();
      const MemStats& m = t.arena().stats();
      const plan::MemoryPlan mp = plan::plan_memory(t.options(), parallel::MeshLayout{.dp = W, .ep = ep}, 0);
      const std::string what = strfmt("dp=%d ep=%d zero=%d rank %d", W, ep, zero, world.rank());
      EXPECT_EQ(mp.bytes[size_t(MemCategory::params)], m.peak[size_t(MemCategory::params)]) << what << ": params";
      EXPECT_EQ(mp.bytes[size_t(MemCategory::optimizer)], m.peak[size_t(MemCategory::optimizer)]) << what << ": optimizer";
      // Dropless without ep every mixture buffer's size is known; under ep the rows a rank's experts
      // receive follow the routing (mpi_moe_cp_test bounds them on more tokens).
      if (ep == 1) {
        EXPECT_EQ(mp.bytes[size_t(MemCategory::activations)], m.peak[size_t(MemCategory::activations)]) << what << ": activations";
      }
      const size_t g = m.peak[size_t(MemCategory::grads)];
      if (zero < 2) {
        EXPECT_EQ(mp.bytes[size_t(MemCategory::grads)], g) << what << ": grads";
      } else {
        EXPECT_GE(g, mp.grads_least) << what;
        EXPECT_LE(mp.grads_least, mp.bytes[size_t(MemCategory::grads)]) << what;
        EXPECT_LE(mp.bytes[size_t(MemCategory::grads)], mp.grads_bound) << what;
        EXPECT_LE(g, mp.grads_bound) << what;
      }
      // The dp group's bytes: the dense weights' over dp x cp and the experts' over the expert-data group.
      expect_same_bytes(t.group_counters(parallel::MeshDim::dp), plan::plan_comm(t.options(), parallel::MeshLayout{.dp = W, .ep = ep}, 0, t.mesh().coord(parallel::MeshDim::dp)).dp,
                           what + " dp");
      if (ep > 1) {
        // The ep group's token exchange: its calls and the norm scalar exactly; its bytes follow the
        // routing, which the plan takes as balanced (a missing direction, pass or factor of the row
        // width would land outside the half to one and a half kept here).
        const parallel::CommCounters got = t.ep_counters();
        const parallel::CommCounters want = plan::plan_comm(t.options(), parallel::MeshLayout{.dp = W, .ep = ep}, 0).ep;
        const auto a2a = parallel::CommOp::all_to_all, ag = parallel::CommOp::all_gather;
        EXPECT_EQ(got[a2a].calls, want[a2a].calls) << what << ": ep all_to_all calls";
        EXPECT_EQ(got[ag].calls, want[ag].calls) << what << ": ep scalars";
        EXPECT_EQ(got[ag].sent_bytes, want[ag].sent_bytes) << what << ": ep scalars";
        const double ratio = double(got[a2a].sent_bytes) / double(want[a2a].sent_bytes);
        EXPECT_GT(ratio, 0.5) << what << ": ep all_to_all bytes " << got[a2a].sent_bytes << " vs " << want[a2a].sent_bytes;
        EXPECT_LT(ratio, 1.5) << what << ": ep all_to_all bytes " << got[a2a].sent_bytes << " vs " << want[a2a].sent_bytes;
        if (world.rank() == 0) std::printf("%s: ep all_to_all bytes %llu, planned (balanced) %llu\n", what.c_str(),
                                           (unsigned long long)got[a2a].sent_bytes, (unsigned long long)want[a2a].sent_bytes);
      }
      const uint64_t params = m.peak[size_t(MemCategory::params)];
      if (world.rank() == 0)
        std::printf("%s: params %llu grads %zu optimizer %zu (planned %llu %llu %llu)\n", what.c_str(),
                    (unsigned long long)params, g, m.peak[size_t(MemCategory::optimizer)],
                    (unsigned long long)mp.bytes[0], (unsigned long long)mp.bytes[1], (unsigned long long)mp.bytes[2]);
      if (ep == 1) {
        params_ep1 = params;
        continue;
      }
      EXPECT_LT(params, params_ep1) << what << ": a rank holding fewer experts stores fewer bytes";
      if (zero == 0) {
        const int64_t C = o.model.n_embd, E = o.model.moe.experts;
        const double expert_bytes = 2.0 * double(E) * double(8 * C * C + 5 * C) * 4;  // 2 mixture layers
        const double saved = double(params_ep1) - double(params);
        EXPECT_NEAR(saved, (1.0 - 1.0 / ep) * expert_bytes, 2 * 2 * 16.0 * W * 4) << what;
      }
    }
  }
}

}  // namespace
}  // namespace mt::train
