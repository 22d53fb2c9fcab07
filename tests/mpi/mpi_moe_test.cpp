// Mixture-of-experts layers under data parallelism: each rank routes its own rows, the routing
// statistics and the routing bias's loads are summed over dp, so for every ZeRO stage a dp run matches
// the single-rank run of the same global batch (dropless, balance = bias: every per-token term of the
// objective is the same), every replica holds the same bias, and the metrics count every rank's
// tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/mpi/mpi_test_util.h"
#include "tests/mpi/mpi_train_util.h"
#include "train/trainer.h"

namespace mt::testing {
namespace {

using config::TrainOptions;
using train::Trainer;

config::TrainOptions options(const std::string& data, int batch, int zero, int dp) {
  config::TrainOptions o = config::parse_train_options(
      {"model=tiny-moe", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32", "model.n_head=4",
       "model.block_size=16", "moe.every=1", "moe.shared=1", "moe.balance=bias", "moe.bias_rate=0.01",
       "seq_len=16", "steps=12", "optim.lr=3e-3", "optim.warmup_steps=3", "threads=1", "data.prefetch=0",
       "data.path=" + data});
  o.batch_size = batch;
  o.parallel.zero = zero;
  o.parallel.dp = dp;
  return o;
}

TEST(MoeDataParallel, EveryZeroStageMatchesTheSingleRankRunAndKeepsOneBias) {
  parallel::Comm& world = mpi_world().comm();
  const int D = world.size();
  const std::string data = shared_corpus(world);
  const int B = 2;
  const config::TrainOptions ro = options(data, D * B, 0, 1);
  Trainer ref(ro);
  const Curve want = train_curve(ref, ro.steps);
  const std::vector<float> want_bias = ref.model().moe_bias(1);
  for (int zero = 0; zero <= 3; zero++) {
    Trainer t(options(data, B, zero, D), &world);
    std::vector<double> loss;
    for (int i = 0; i < ro.steps; i++) {
      const train::StepResult r = t.step();
      loss.push_back(r.loss);
      int64_t routed = 0;
      for (const auto& n : r.moe["tokens_per_expert"][0]) routed += n.get<int64_t>();
      EXPECT_EQ(routed, int64_t(D) * B * ro.seq_len * ro.model.moe.top_k) << "zero " << zero;
    }
    const double loss_err = max_rel(loss, want.loss);
    const double w_err = weight_err(t.global_master(), want.weights);
    if (world.rank() == 0) std::printf("dp %d zero %d: loss rel err %.2e, weight err %.2e\n", D, zero, loss_err, w_err);
    EXPECT_LT(loss_err, 1e-5) << "zero " << zero;
    EXPECT_LT(w_err, 1e-4) << "zero " << zero;
    // Every replica's bias equals the single rank's (the loads are whole numbers summed over dp).
    EXPECT_EQ(t.model().moe_bias(1), want_bias) << "zero " << zero << " rank " << world.rank();
  }
}

}  // namespace
}  // namespace mt::testing
