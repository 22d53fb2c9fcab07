// The router as the model relies on it: top-k by probability with ties to the lower expert, gates
// that sum to one, the balance term A = 1 for uniform probabilities, every part of its gradient (gates,
// load-balancing loss, z-loss, the logits GEMM) against finite differences, and the aux-loss-free
// bias update moving the load toward balance.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "moe/router.h"
#include "tests/test_util.h"

namespace mt::moe {
namespace {

TEST(Router, TopKIsBestFirstWithTiesToTheLowerExpert) {
  // Token 0: clear order 2 > 0 > 3 > 1. Token 1: all equal, so experts 0 and 1.
  const std::vector<float> logits = {1.0f, -1.0f, 2.0f, 0.5f, 0.3f, 0.3f, 0.3f, 0.3f};
  const Routing r = route(logits.data(), nullptr, 2, 4, 2);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{2, 0, 0, 1}));
  for (int t = 0; t < 2; t++) EXPECT_NEAR(r.gate[size_t(t) * 2] + r.gate[size_t(t) * 2 + 1], 1.0, 1e-6);
  EXPECT_NEAR(r.gate[0] / r.gate[1], std::exp(1.0), 1e-5);  // renormalised p_2 / p_0
  EXPECT_EQ(r.load, (std::vector<int64_t>{2, 1, 1, 0}));
  // A bias changes the choice but not the gates' source: token 1 now prefers expert 3, then 2.
  const std::vector<float> bias = {0.f, 0.f, 0.1f, 0.2f};
  const Routing rb = route(logits.data(), bias.data(), 2, 4, 2);
  EXPECT_EQ(rb.expert[2], 3);
  EXPECT_EQ(rb.expert[3], 2);
  EXPECT_NEAR(rb.gate[2], 0.5, 1e-6);  // equal probabilities, equal gates
  // k = 1: the gate is the probability itself.
  const Routing r1 = route(logits.data(), nullptr, 2, 4, 1);
  EXPECT_FLOAT_EQ(r1.gate[0], r1.probs[2]);
  EXPECT_FLOAT_EQ(r1.gate[1], 0.25f);
}

TEST(Router, BalanceIsOneForUniformProbabilitiesAndZLossIsTheSquaredLogSumExp) {
  const int N = 6, E = 4;
  const std::vector<float> logits(size_t(N) * E, 0.5f);
  const Routing r = route(logits.data(), nullptr, N, E, 2);
  EXPECT_NEAR(r.balance, 1.0, 1e-6);
  const double lse = 0.5 + std::log(4.0);
  EXPECT_NEAR(r.z, lse * lse, 1e-5);
}

// J(logits) = sum c_tj gate_tj + aux_w A + z_w Z, evaluated in double from a routing.
double objective(const Routing& r, const std::vector<double>& c, double aux_w, double z_w) {
  double j = aux_w * r.balance + z_w * r.z;
  for (size_t i = 0; i < r.gate.size(); i++) j += c[i] * r.gate[i];
  return j;
}

// Finite differences of the whole router, logits GEMM included, for each part of the objective alone
// and all together; coordinates where the perturbation changes the top-k choice are skipped.
TEST(Router, GradientOfGatesAuxAndZLossMatchesFiniteDifferences) {
  std::mt19937_64 rng(testing::test_seed());
  const int N = 12, C = 6, E = 5, K = 2;
  ops::Ctx ctx;
  for (int part = 0; part < 4; part++) {
    const double aux_w = (part == 1 || part == 3) ? 2.0 : 0.0, z_w = (part == 2 || part == 3) ? 0.5 : 0.0;
    const double gate_scale = (part == 0 || part == 3) ? 1.0 : 0.0;
    std::vector<float> x = testing::random_floats(size_t(N) * C, rng), w = testing::random_floats(size_t(E) * C, rng);
    std::vector<double> c(size_t(N) * K);
    for (double& v : c) v = gate_scale * std::uniform_real_distribution<double>(-1, 1)(rng);
    auto eval = [&](Routing* keep) {
      std::vector<float> logits(size_t(N) * E);
      router_logits(logits.data(), x.data(), w.data(), N, C, E, ctx);
      Routing r = route(logits.data(), nullptr, N, E, K);
      const double j = objective(r, c, aux_w, z_w);
      if (keep) *keep = std::move(r);
      return j;
    };
    Routing r;
    eval(&r);
    std::vector<float> dgate(c.begin(), c.end()), dlogits(size_t(N) * E), dx(size_t(N) * C), dw(size_t(E) * C, 0.f);
    route_backward(dlogits.data(), dgate.data(), r, aux_w, z_w);
    router_logits_backward(dx.data(), dw.data(), dlogits.data(), x.data(), w.data(), N, C, E, ctx);
    int checked = 0;
    double largest = 0;
    for (std::vector<float>* v : {&x, &w}) {
      const std::vector<float>& grad = v == &x ? dx : dw;
      for (size_t i = 0; i < v->size(); i++) {
        const float keep = (*v)[i];
        // A step that moves a token across a top-k boundary is retried four times smaller, then skipped.
        double fd = NAN;
        for (const float eps : {1e-2f, 2.5e-3f}) {
          Routing rp, rm;
          (*v)[i] = keep + eps;
          const double jp = eval(&rp);
          (*v)[i] = keep - eps;
          const double jm = eval(&rm);
          (*v)[i] = keep;
          if (rp.expert == r.expert && rm.expert == r.expert) {
            fd = (jp - jm) / (2.0 * eps);
            break;
          }
        }
        if (std::isnan(fd)) continue;
        EXPECT_NEAR(grad[i], fd, 2e-3 + 1e-2 * std::fabs(fd)) << "part " << part << " coordinate " << i;
        largest = std::max(largest, std::fabs(fd));
        checked++;
      }
    }
    EXPECT_GT(checked, (N * C + E * C) * 3 / 4) << "part " << part;
    EXPECT_GT(largest, 0.01) << "part " << part << ": a vacuous check";
  }
}

// Aux-loss-free balancing: a router that sends most tokens to expert 0 is brought toward balance by
// the bias alone (the logits never change); the opposite sign would make it worse.
TEST(Router, BiasUpdateMovesLoadTowardBalance) {
  std::mt19937_64 rng(testing::test_seed());
  const int N = 512, E = 8, K = 2;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> logits(size_t(N) * E);
  for (int t = 0; t < N; t++)
    for (int e = 0; e < E; e++) logits[size_t(t) * E + e] = nd(rng) + (e == 0 ? 2.f : e == 1 ? 1.f : 0.f);
  std::vector<float> bias(size_t(E), 0.f);
  const double before = load_imbalance(route(logits.data(), bias.data(), N, E, K).load);
  double after = 0;
  const int steps = 400, tail = 100;
  for (int s = 0; s < steps; s++) {
    const Routing r = route(logits.data(), bias.data(), N, E, K);
    if (s >= steps - tail) after += load_imbalance(r.load) / tail;
    update_bias(bias, r.load, 5e-3f);
  }
  std::printf("load imbalance (max/mean - 1): %.3f before, %.3f after (mean of the last %d steps)\n", before, after,
              tail);
  EXPECT_GT(before, 1.0);
  EXPECT_LT(after, 0.25 * before);
  EXPECT_LT(after, 0.3);
}

TEST(Router, UpdateBiasFollowsTheSignOfTheLoadGap) {
  std::vector<float> b = {0.f, 0.f, 0.f};
  update_bias(b, {5, 3, 1}, 0.5f);  // mean 3
  EXPECT_EQ(b, (std::vector<float>{-0.5f, 0.f, 0.5f}));
  EXPECT_DOUBLE_EQ(load_imbalance({5, 3, 1}), 5.0 / 3.0 - 1.0);
  EXPECT_DOUBLE_EQ(load_imbalance({0, 0}), 0.0);
}

}  // namespace
}  // namespace mt::moe
