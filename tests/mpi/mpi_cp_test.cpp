// Context parallelism (--cp: zigzag chunks of every sequence, ring attention) changes nothing but
// memory and speed: every layout's loss curve, gradient norm and final weights match a single-rank run
// of the same global batch, with packed-document masks (documents spanning chunk boundaries); the
// bytes the cp group sent per step equal ring attention's formula (parallel/ring_attention.h); a state
// saved under a cp layout stores every element once and resumes under layouts without cp (and under
// pp2 x dp4 from tp2 x cp2 x pp2) with the uninterrupted run's losses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/format.h"
#include "checkpoint/reader.h"
#include "parallel/ring_attention.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/mpi_train_util.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::testing {
namespace {

using config::TrainOptions;
using train::Trainer;

constexpr int kT = 32;  // seq_len: 2 cp chunks of 8 tokens at cp 2, of 4 at cp 4

struct Layout {
  int cp = 1, tp = 1, dp = 1, pp = 1, zero = 0, accum = 1;
  bool doc_mask = true;
  const char* recompute = "none";
  const char* schedule = "1f1b";  // with pp > 1
  std::string str() const {
    return strfmt("cp=%d tp=%d pp=%d%s%s dp=%d zero=%d accum=%d recompute=%s%s", cp, tp, pp, pp > 1 ? " " : "",
                  pp > 1 ? schedule : "", dp, zero, accum, recompute, doc_mask ? " doc_mask" : "");
  }
};

config::TrainOptions options(const std::string& data, const Layout& l, int batch, int steps) {
  config::TrainOptions o = config::parse_train_options(
      {"model=tiny", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
       "model.block_size=" + std::to_string(kT), "seq_len=" + std::to_string(kT), "optim.lr=3e-3",
       "optim.warmup_steps=3", "data.mode=shuffled", "threads=1", "data.prefetch=0", "data.path=" + data,
       "attention=flash", std::string("recompute=") + l.recompute,
       std::string("data.doc_mask=") + (l.doc_mask ? "true" : "false"), "steps=" + std::to_string(steps),
       "optim.eps=1e-6"});  // as in mpi_tp_test.cpp: keeps never-firing units' weights still
  o.batch_size = batch;
  o.grad_accum = l.accum;
  o.parallel.zero = l.zero;
  o.parallel.dp = l.dp;
  o.parallel.tp = l.tp;
  o.parallel.cp = l.cp;
  o.parallel.pp = l.pp;
  o.parallel.pp_schedule = l.schedule;
  o.parallel.bucket_mb = 0.01;
  o.validate();
  return o;
}

std::vector<Layout> layouts(int W) {
  std::vector<Layout> out;
  auto add = [&](Layout l) {
    if (l.cp * l.tp * l.pp * l.dp == W) out.push_back(l);
  };
  add({.cp = 2});
  add({.cp = 2, .doc_mask = false});
  add({.cp = 2, .zero = 1, .accum = 2, .recompute = "full"});
  add({.cp = 4});
  add({.cp = 4, .zero = 3, .recompute = "selective"});
  add({.cp = 2, .dp = 2, .zero = 2});
  add({.cp = 2, .tp = 2});
  add({.cp = 2, .pp = 2, .accum = 2});
  add({.cp = 2, .pp = 2, .accum = 2, .schedule = "zb1"});
  add({.cp = 2, .tp = 2, .pp = 2, .accum = 2});                  // 8 ranks
  add({.cp = 2, .tp = 2, .dp = 2, .pp = 2, .zero = 1, .accum = 2});  // all four dimensions: 16 ranks
  return out;
}

// Bytes a rank sends on the cp group per micro-batch (fp32, every layer's forward and backward):
// ring_attention.h's formula with N_l = B T/cp rows and W = C/tp columns of heads.
uint64_t cp_bytes_per_micro(const Layout& l, int B, int C, int n_layer) {
  const uint64_t P = uint64_t(l.cp), Nl = uint64_t(B) * kT / P, kv = Nl * 2 * uint64_t(C / l.tp) * 4;
  const uint64_t docs = l.doc_mask ? 2 * (P - 1) * Nl * 4 : 0;
  // Full recompute runs each layer's forward (its ring) once more in backward.
  const uint64_t fwd = (P - 1) * kv + docs / 2, bwd = (P - 1) * kv + P * kv + docs / 2;
  return uint64_t(n_layer) * ((std::string(l.recompute) == "full" ? 2 : 1) * fwd + bwd);
}

TEST(ContextParallel, EveryLayoutMatchesTheSingleRankRun) {
  parallel::Comm& world = mpi_world().comm();
  const int W = world.size();
  const std::string data = shared_corpus(world);
  const int B = 2, steps = 10;
  const std::vector<Layout> ls = layouts(W);
  if (ls.empty()) GTEST_SKIP() << "no context-parallel layout for " << W << " ranks";
  for (const Layout& l : ls) {
    Layout single = l;
    single.cp = single.tp = single.dp = single.pp = 1;
    single.zero = 0;
    Trainer ref(options(data, single, l.dp * B, steps));
    const Curve want = train_curve(ref, steps);
    Trainer t(options(data, l, B, steps), &world);
    const Curve got = train_curve(t, steps);
    const CurveErr e = curve_err(got, want);
    if (world.rank() == 0) std::printf("%s: %s\n", l.str().c_str(), e.str().c_str());
    expect_fp32_match(e, l.str());
    // The last step's traffic on the cp group: ring attention's, nothing else.
    const uint64_t sent = t.group_counters(parallel::MeshDim::cp).total_sent_bytes();
    EXPECT_EQ(sent, uint64_t(l.accum) * cp_bytes_per_micro(l, B, 32, 2 / l.pp)) << l.str();
    std::vector<float> flat;
    for (const auto& w : got.weights) flat.insert(flat.end(), w.begin(), w.end());
    EXPECT_TRUE(same_on_all_ranks(world, flat.data(), flat.size() * 4)) << "ranks disagree on the weights";
  }
}

// Saved after 5 steps under a cp layout, resumed under others with the same global batch (grad_accum 2):
// the continued losses are the uninterrupted single-rank run's.
TEST(ContextParallel, StateSavedUnderCpResumesUnderOtherLayouts) {
  parallel::Comm& world = mpi_world().comm();
  const int W = world.size();
  if (W != 2 && W != 4 && W != 8) GTEST_SKIP();
  const std::string data = shared_corpus(world);
  const int G = 2 * W, steps = 10;  // rows per micro-batch step over all dp ranks, 2 micro-batches
  auto rows = [&](const Layout& l) { return G / (l.dp * l.accum); };
  const Layout single{.accum = 2};
  Trainer ref(options(data, single, rows(single), steps));
  const Curve want = train_curve(ref, steps);
  char root[256] = {};
  if (world.rank() == 0) std::snprintf(root, sizeof root, "%s", make_temp_dir("mt_cp_state").c_str());
  world.broadcast(root, sizeof root / 4, DType::i32, 0);
  const std::string dir(root);
  const Layout from = W == 2 ? Layout{.cp = 2, .zero = 1, .accum = 2}
                      : W == 4 ? Layout{.cp = 2, .tp = 2, .accum = 2}
                               : Layout{.cp = 2, .tp = 2, .pp = 2, .zero = 1, .accum = 2};
  {
    Trainer t(options(data, from, rows(from), steps), &world);
    for (int i = 0; i < 5; i++) t.step();
    t.save_state(dir + "/a");
  }
  world.barrier();
  {  // Every element stored once: the cp ranks of a replica write one copy between them.
    const checkpoint::Reader r(dir + "/a/" + checkpoint::step_dir_name(5));
    int64_t stored = 0, total = 0;
    for (const checkpoint::FileRecord& f : r.manifest().files)
      for (const checkpoint::PieceRecord& p : f.pieces) stored += p.flat_end - p.flat_begin;
    for (const checkpoint::TensorInfo& t : r.tensors()) total += t.numel();
    EXPECT_EQ(stored, total) << from.str() << ": replicated state written more than once";
  }
  std::vector<Layout> to = {{.dp = W, .zero = 3, .accum = 2}, {.accum = 2}};
  if (W == 8) to.push_back({.dp = 4, .pp = 2, .accum = 2});  // tp2 x cp2 x pp2 -> pp2 x dp4
  for (const Layout& lo : to) {
    config::TrainOptions o = options(data, lo, rows(lo), steps);
    o.resume = dir + "/a";
    const bool alone = lo.cp * lo.tp * lo.pp * lo.dp == 1;
    Trainer t(o, alone ? nullptr : &world);
    double err = 0;
    for (int i = 5; i < steps; i++)
      err = std::max(err, std::fabs(t.step().loss - want.loss[size_t(i)]) / want.loss[size_t(i)]);
    if (world.rank() == 0)
      std::printf("resume %s -> %s: max rel loss err %.2e\n", from.str().c_str(), lo.str().c_str(), err);
    EXPECT_LE(err, 1e-5) << from.str() << " -> " << lo.str();
  }
}

}  // namespace
}  // namespace mt::testing
