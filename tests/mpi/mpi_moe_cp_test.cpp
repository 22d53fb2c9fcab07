// Mixtures of experts under context parallelism (--cp): each cp rank routes its zigzag chunks' tokens,
// and the balance term and the drops are decided over the whole micro-batch (moe/token_group.h). The
// token group's plan keeps on every rank exactly what the one-rank plan of the micro-batch keeps; cp2,
// cp2 x ep2 (2 ranks) and cp2 x tp2 x pp2 x ep2 (8 ranks) train as the single-rank run of the same
// micro-batches on packed documents, dropless with and without the aux term and with a capacity that
// drops (the same assignments, step by step); a state saved under cp2 x ep2 resumes under tp2 x pp2
// and alone, and one saved alone resumes under cp2 x ep2 (4 ranks); the planner's model state and
// bytes per group equal the trainer's.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "moe/token_group.h"
#include "parallel/mesh.h"
#include "plan/cost.h"
#include "plan/memory.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/mpi_train_util.h"
#include "train/trainer.h"

namespace mt::testing {
namespace {

using train::Trainer;

constexpr int kT = 16;  // seq_len: cp2's chunks are 4 tokens, so documents cross chunk boundaries

struct Layout {
  int cp = 1, tp = 1, pp = 1, ep = 1, accum = 1;
  model::MoeBalance balance = model::MoeBalance::aux;
  double capacity = 0;  // 0: dropless
  std::string str() const {
    return strfmt("cp=%d tp=%d pp=%d ep=%d accum=%d balance=%s capacity=%g", cp, tp, pp, ep, accum,
                  model::moe_balance_name(balance), capacity);
  }
};

config::TrainOptions options(const std::string& data, const Layout& l, int batch, int steps) {
  config::TrainOptions o = config::parse_train_options(
      {"model=tiny-moe", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
       "model.block_size=" + std::to_string(kT), "seq_len=" + std::to_string(kT), "moe.every=1", "moe.shared=1",
       "moe.bias_rate=0.01", "moe.aux_coef=0.05", "optim.lr=3e-3", "optim.warmup_steps=3", "data.mode=shuffled",
       "data.doc_mask=true", "attention=flash", "threads=1", "data.prefetch=0", "data.path=" + data,
       "steps=" + std::to_string(steps), "optim.eps=1e-6"});
  o.batch_size = batch;
  o.grad_accum = l.accum;
  o.parallel.dp = 1;
  o.parallel.cp = l.cp;
  o.parallel.tp = l.tp;
  o.parallel.pp = l.pp;
  o.parallel.ep = l.ep;
  o.model.moe.balance = l.balance;
  o.model.moe.capacity = l.capacity;
  o.validate();
  return o;
}

// The token group's plan on its own: a random routing of a micro-batch (B sequences of T tokens) spread
// over the world as cp ranks, and (an even world) as tp pairs under sp inside cp; every rank keeps the
// assignments the one-rank plan of the whole micro-batch keeps, lays its rows out as a one-rank plan
// does, and the group's sums are the same bits everywhere.
TEST(MoeTokenGroup, EachRankKeepsWhatTheWholeMicroBatchsPlanKeeps) {
  parallel::Comm& world = mpi_world().comm();
  const int W = world.size(), B = 3, K = 2, E = 5;
  for (int tp : {1, 2}) {
    if (W % tp != 0) continue;
    const int cp = W / tp, T = 4 * cp, Ntot = B * T, N = Ntot / W;
    std::unique_ptr<parallel::Comm> tpc = world.split(world.rank() / tp, world.rank() % tp, "tp");
    std::unique_ptr<parallel::Comm> cpc = world.split(world.rank() % tp, world.rank() / tp, "cp");
    moe::TokenGroup g;
    g.tp = tp > 1 ? tpc.get() : nullptr;
    g.cp = cp > 1 ? cpc.get() : nullptr;
    g.B = B, g.T = T;
    // The same routing on every rank (one seed), skewed to expert 0 so that capacity drops.
    std::mt19937 rng{uint32_t(shared_seed())};
    std::vector<int32_t> whole(size_t(Ntot) * K);
    for (int t = 0; t < Ntot; t++) {
      whole[size_t(t) * K] = int32_t(rng() % 3 == 0 ? rng() % E : 0);
      whole[size_t(t) * K + 1] = int32_t((whole[size_t(t) * K] + 1 + rng() % (E - 1)) % E);
    }
    const std::vector<int64_t> at = g.token_index(tp > 1 ? tpc->rank() : 0, cp > 1 ? cpc->rank() : 0, N);
    std::vector<int32_t> mine(size_t(N) * K);
    for (int i = 0; i < N; i++)
      for (int k = 0; k < K; k++) mine[size_t(i) * K + k] = whole[size_t(at[size_t(i)] * K + k)];
    for (double factor : {0.5, 1.0, 4.0}) {
      const std::string what = strfmt("tp %d x cp %d, capacity factor %g, rank %d", tp, cp, factor, world.rank());
      const moe::DispatchPlan want = moe::plan_dispatch(whole.data(), Ntot, K, E, moe::expert_capacity(factor, Ntot, K, E));
      const moe::DispatchPlan got = moe::plan_over_group(g, mine.data(), N, K, E, factor);
      EXPECT_EQ(got.capacity, want.capacity) << what;
      for (int i = 0; i < N; i++)
        for (int k = 0; k < K; k++)
          EXPECT_EQ(got.row_of[size_t(i) * K + k] >= 0, want.row_of[size_t(at[size_t(i)] * K + k)] >= 0)
              << what << ": token " << at[size_t(i)] << " choice " << k;
      // The rows: expert by expert, within an expert in increasing assignment, as a one-rank plan.
      for (int e = 0; e < E; e++)
        for (int64_t r = got.offset[size_t(e)]; r < got.offset[size_t(e) + 1]; r++) {
          const int32_t a = got.assignment_of[size_t(r)];
          EXPECT_EQ(mine[size_t(a)], e) << what;
          EXPECT_EQ(got.row_of[size_t(a)], r) << what;
          if (r > got.offset[size_t(e)]) {
            EXPECT_GT(a, got.assignment_of[size_t(r) - 1]) << what;
          }
        }
      int32_t dropped = int32_t(got.dropped);
      world.all_reduce(&dropped, 1, DType::i32, parallel::ReduceOp::sum);
      EXPECT_EQ(dropped, want.dropped) << what;
      if (factor == 0.5) {
        EXPECT_GT(want.dropped, 0) << what << ": nothing dropped, nothing proven";
      }
    }
    std::vector<double> x(7);
    for (size_t i = 0; i < x.size(); i++) x[i] = 0.1 * double(world.rank() + 1) / double(i + 3);
    std::vector<double> s = g.sum(x);
    EXPECT_TRUE(same_on_all_ranks(world, s.data(), s.size() * 8)) << "tp " << tp;
    for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(s[i], 0.1 * W * (W + 1) / 2 / double(i + 3), 1e-12);
  }
}

// Each layout against the single-rank run of the same micro-batches. A fixed corpus: ring attention
// sums in another order than one rank, and where two experts' scores nearly tie a routing could flip
// (as the tp and pp tests of mpi_ep_test.cpp say).
TEST(MoeContextParallel, EveryLayoutMatchesTheSingleRankRun) {
  parallel::Comm& world = mpi_world().comm();
  const int W = world.size();
  std::vector<Layout> ls;
  for (const Layout& base : {Layout{.cp = 2}, Layout{.cp = 2, .ep = 2}, Layout{.cp = 2, .tp = 2, .pp = 2, .ep = 2, .accum = 2}}) {
    if (base.cp * base.tp * base.pp != W) continue;
    for (const Layout& v : {Layout{.balance = model::MoeBalance::bias}, Layout{}, Layout{.capacity = 1.0}}) {
      Layout l = base;
      l.balance = v.balance;
      l.capacity = v.capacity;
      ls.push_back(l);
    }
  }
  if (ls.empty()) GTEST_SKIP() << "no layout for " << W << " ranks";
  const std::string data = shared_corpus(world, 20261202);
  const int B = 2, steps = 6;
  for (const Layout& l : ls) {
    Layout single = l;
    single.cp = single.tp = single.pp = single.ep = 1;
    Trainer ref(options(data, single, B, steps));
    Trainer t(options(data, l, B, steps), &world);
    Curve want, got;
    const double dropped = step_beside(ref, t, steps, want, got, l.str());
    want.weights = ref.global_master();
    got.weights = t.global_master();
    if (l.capacity > 0) {
      EXPECT_GT(dropped, 0) << l.str() << ": nothing dropped, nothing proven";
    }
    const CurveErr e = curve_err(got, want);
    if (world.rank() == 0) std::printf("%s: %s\n", l.str().c_str(), e.str().c_str());
    expect_fp32_match(e, l.str());
    if (l.balance == model::MoeBalance::bias && t.mesh().last_stage()) {
      EXPECT_EQ(t.model().moe_bias(1), ref.model().moe_bias(1)) << l.str();
    }
  }
}

// Saved under cp2 x ep2 (ranks 0 and 1) after 4 steps: resumed under tp2 x pp2 (4 ranks) and alone,
// the uninterrupted run's losses; and saved alone, resumed under cp2 x ep2. One global batch for all:
// 2 micro-batches of B rows.
TEST(MoeContextParallel, StateSavedUnderCpAndEpResumesUnderOtherLayouts) {
  parallel::Comm& world = mpi_world().comm();
  if (world.size() != 4) GTEST_SKIP();
  const std::string data = shared_corpus(world, 20261202);
  const int B = 2, steps = 7, at = 4;
  const Layout single{.accum = 2, .balance = model::MoeBalance::bias}, cp_ep{.cp = 2, .ep = 2, .accum = 2, .balance = model::MoeBalance::bias},
      tp_pp{.tp = 2, .pp = 2, .accum = 2, .balance = model::MoeBalance::bias};
  char root[256] = {};
  if (world.rank() == 0) std::snprintf(root, sizeof root, "%s", make_temp_dir("mt_moe_cp_state").c_str());
  world.broadcast(root, sizeof root / 4, DType::i32, 0);
  const std::string dir(root);
  const bool pair = world.rank() < 2;
  std::unique_ptr<parallel::Comm> two = world.split(pair ? 0 : 1, world.rank(), "pair");
  Trainer ref(options(data, single, B, steps));
  Curve want;
  for (int i = 0; i < steps; i++) {
    want.loss.push_back(ref.step().loss);
    if (i + 1 == at && world.rank() == 0) ref.save_state(dir + "/alone");
  }
  if (pair) {
    Trainer t(options(data, cp_ep, B, steps), two.get());
    for (int i = 0; i < at; i++) t.step();
    t.save_state(dir + "/cp_ep");
  }
  world.barrier();
  auto resumed = [&](const Layout& l, const std::string& from, parallel::Comm* comm) {
    config::TrainOptions o = options(data, l, B, steps);
    o.resume = dir + "/" + from;
    Trainer t(o, comm);
    double err = 0;
    for (int i = at; i < steps; i++)
      err = std::max(err, std::fabs(t.step().loss - want.loss[size_t(i)]) / want.loss[size_t(i)]);
    const std::string what = from + " -> " + l.str();
    if (world.rank() == 0) std::printf("resume %s: max rel loss err %.2e\n", what.c_str(), err);
    EXPECT_LE(err, 1e-5) << what;
  };
  resumed(tp_pp, "cp_ep", &world);
  if (world.rank() == 0) resumed(single, "cp_ep", nullptr);
  if (pair) resumed(cp_ep, "alone", two.get());
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

// The planner against the trainer under cp with mixture layers: the model state (params, grads,
// optimizer) exactly, the activations near (below), the bytes per step of the dp x cp group and of the cp group (ring attention and
// the token group's gathers) exactly; the ep group's calls and scalars exactly, its row bytes near the
// planner's balanced figure (they follow the routing).
TEST(MoeContextParallel, PlannerModelStateAndBytesEqualTheTrainers) {
  parallel::Comm& world = mpi_world().comm();
  const int W = world.size();
  std::vector<Layout> layouts;
  if (W == 2)
    layouts = {Layout{.cp = 2}, Layout{.cp = 2, .capacity = 1.0}, Layout{.cp = 2, .ep = 2},
               Layout{.cp = 2, .ep = 2, .capacity = 1.0}};
  if (W == 4) layouts = {Layout{.cp = 2, .tp = 2}, Layout{.cp = 2, .tp = 2, .capacity = 1.0}};
  if (W == 8) layouts = {Layout{.cp = 2, .tp = 2, .pp = 2, .ep = 2, .accum = 2}};
  if (layouts.empty()) GTEST_SKIP();
  const std::string data = shared_corpus(world, 20261202);
  for (const Layout& l : layouts) {
    Trainer t(options(data, l, 16, 3), &world);
    t.step();
    t.arena().reset_peaks();
    t.step();
    const MemStats& m = t.arena().stats();
    const parallel::MeshLayout pl{.dp = 1, .pp = l.pp, .cp = l.cp, .tp = l.tp, .ep = l.ep};
    const int pp_rank = t.mesh().coord(parallel::MeshDim::pp);
    const plan::MemoryPlan mp = plan::plan_memory(t.options(), pl, pp_rank);
    const std::string what = l.str() + strfmt(" rank %d", world.rank());
    for (MemCategory c : {MemCategory::params, MemCategory::grads, MemCategory::optimizer})
      EXPECT_EQ(mp.bytes[size_t(c)], m.peak[size_t(c)]) << what << ": " << mem_category_name(c);
    // Activations: within 5% where every buffer's size is known (dropless, no ep); where the rows
    // follow the routing (the experts taken full under a capacity, a rank's experts receiving as many
    // rows as it sends under ep), within 10% on these 128 tokens a rank.
    const double act = double(m.peak[size_t(MemCategory::activations)]);
    const double pred = double(mp.bytes[size_t(MemCategory::activations)]);
    const bool routed = l.ep > 1 || l.capacity > 0;
    EXPECT_NEAR(pred, act, (routed ? 0.10 : 0.05) * act) << what << ": activations";
    std::printf("%s: activations %.0f, planned %.0f (%+.1f%%)\n", what.c_str(), act, pred, 100.0 * (pred - act) / act);
    // The rank's index in the dp x cp group (cp fastest), as the planner takes it.
    const int replica = t.mesh().coord(parallel::MeshDim::dp) * l.cp + t.mesh().coord(parallel::MeshDim::cp);
    const plan::CommPlan want = plan::plan_comm(t.options(), pl, pp_rank, replica);
    expect_same_bytes(t.group_counters(parallel::MeshDim::dp), want.dp, what + " dp x cp");
    expect_same_bytes(t.group_counters(parallel::MeshDim::cp), want.cp, what + " cp");
    if (l.tp > 1) expect_same_bytes(t.group_counters(parallel::MeshDim::tp), want.tp, what + " tp");
    if (l.pp > 1) expect_same_bytes(t.group_counters(parallel::MeshDim::pp), want.pp, what + " pp");
    if (l.ep > 1) {
      const parallel::CommCounters got = t.ep_counters();
      const auto a2a = parallel::CommOp::all_to_all, ag = parallel::CommOp::all_gather;
      EXPECT_EQ(got[a2a].calls, want.ep[a2a].calls) << what << ": ep all_to_all calls";
      EXPECT_EQ(got[ag].sent_bytes, want.ep[ag].sent_bytes) << what << ": ep scalars";
      const double ratio = double(got[a2a].sent_bytes) / double(want.ep[a2a].sent_bytes);
      EXPECT_GT(ratio, 0.5) << what;
      EXPECT_LT(ratio, 1.5) << what;
      std::printf("%s: ep all_to_all bytes %llu, planned (balanced, no drops) %llu\n", what.c_str(),
                  (unsigned long long)got[a2a].sent_bytes, (unsigned long long)want.ep[a2a].sent_bytes);
    }
  }
}

}  // namespace
}  // namespace mt::testing
