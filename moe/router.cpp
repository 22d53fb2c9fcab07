#include "moe/router.h"

#include <algorithm>
#include <cmath>

#include "runtime/check.h"

namespace mt::moe {

Routing route(const float* logits, const float* bias, int N, int E, int K) {
  MT_CHECK(N >= 0 && E > 0 && K >= 1 && K <= E, "route: N %d, E %d, K %d", N, E, K);
  Routing r;
  r.N = N, r.E = E, r.K = K;
  r.probs.resize(size_t(N) * E);
  r.lse.resize(size_t(N));
  r.expert.resize(size_t(N) * K);
  r.gate.resize(size_t(N) * K);
  r.load.assign(size_t(E), 0);
  std::vector<double> mean_p(size_t(E), 0.0);
  std::vector<char> taken(static_cast<size_t>(E));
  double z_sum = 0;
  for (int t = 0; t < N; t++) {
    const float* z = logits + int64_t(t) * E;
    float* p = r.probs.data() + int64_t(t) * E;
    float mx = z[0];
    for (int i = 1; i < E; i++) mx = std::max(mx, z[i]);
    double sum = 0;
    for (int i = 0; i < E; i++) sum += std::exp(double(z[i]) - mx);
    for (int i = 0; i < E; i++) p[i] = float(std::exp(double(z[i]) - mx) / sum);
    const double lse = double(mx) + std::log(sum);
    r.lse[size_t(t)] = float(lse);
    z_sum += lse * lse;
    for (int i = 0; i < E; i++) mean_p[size_t(i)] += p[i];
    // Top-k by score, best first; on equal scores the lower index wins (strict > below).
    std::fill(taken.begin(), taken.end(), 0);
    double gsum = 0;
    for (int j = 0; j < K; j++) {
      int best = -1;
      float best_s = 0;
      for (int i = 0; i < E; i++) {
        if (taken[size_t(i)]) continue;
        const float s = p[i] + (bias ? bias[i] : 0.f);
        if (best < 0 || s > best_s) best = i, best_s = s;
      }
      taken[size_t(best)] = 1;
      r.expert[size_t(t) * K + j] = best;
      r.load[size_t(best)]++;
      gsum += p[best];
    }
    for (int j = 0; j < K; j++) {
      const float pe = p[r.expert[size_t(t) * K + j]];
      r.gate[size_t(t) * K + j] = K == 1 ? pe : float(pe / gsum);
    }
  }
  if (N > 0) {
    double a = 0;
    for (int i = 0; i < E; i++) a += double(r.load[size_t(i)]) / (double(N) * K) * (mean_p[size_t(i)] / N);
    r.balance = E * a;
    r.z = z_sum / N;
  }
  return r;
}

void route_backward(float* dlogits, const float* dgate, const Routing& r, double aux_weight, double z_weight) {
  const int N = r.N, E = r.E, K = r.K;
  if (N == 0) return;
  // dA/dp_{t,i} = E f_i / N with f_i = load_i / (N K); dZ/dz_{t,i} = 2 lse_t p_{t,i} / N.
  std::vector<double> daux(static_cast<size_t>(E));
  for (int i = 0; i < E; i++) daux[size_t(i)] = aux_weight * E * (double(r.load[size_t(i)]) / (double(N) * K)) / N;
  std::vector<double> dp(static_cast<size_t>(E));
  for (int t = 0; t < N; t++) {
    const float* p = r.probs.data() + int64_t(t) * E;
    const int32_t* ex = r.expert.data() + int64_t(t) * K;
    const float* dg = dgate + int64_t(t) * K;
    for (int i = 0; i < E; i++) dp[size_t(i)] = daux[size_t(i)];
    if (K == 1) {
      dp[size_t(ex[0])] += dg[0];
    } else {
      // g_j = p_{e_j} / s with s the sum of the chosen p: dg_j/dp_{e_m} = (delta_jm - g_j) / s.
      double s = 0, dot = 0;
      for (int j = 0; j < K; j++) s += p[ex[j]];
      for (int j = 0; j < K; j++) dot += double(dg[j]) * r.gate[size_t(t) * K + j];
      for (int j = 0; j < K; j++) dp[size_t(ex[j])] += (double(dg[j]) - dot) / s;
    }
    // Softmax backward: dz_i = p_i (dp_i - sum_j p_j dp_j), plus the z-loss term.
    double pdp = 0;
    for (int i = 0; i < E; i++) pdp += double(p[i]) * dp[size_t(i)];
    const double zterm = z_weight * 2.0 * r.lse[size_t(t)] / N;
    float* dz = dlogits + int64_t(t) * E;
    for (int i = 0; i < E; i++) dz[i] = float(double(p[i]) * (dp[size_t(i)] - pdp + zterm));
  }
}

void router_logits(float* logits, const float* x, const float* w, int N, int C, int E, const ops::Ctx& ctx) {
  if (N == 0) return;
  ops::matmul_fwd<float>(logits, x, w, nullptr, N, C, E, ctx);
}

void router_logits_backward(float* dx, float* dw, const float* dlogits, const float* x, const float* w, int N, int C,
                            int E, const ops::Ctx& ctx) {
  if (N == 0) return;
  ops::matmul_bwd<float>(dx, dw, nullptr, dlogits, x, w, N, C, E, ctx);
}

void update_bias(std::vector<float>& bias, const std::vector<int64_t>& load, float rate) {
  MT_CHECK(bias.size() == load.size(), "update_bias: %zu biases, %zu loads", bias.size(), load.size());
  if (load.empty()) return;
  double mean = 0;
  for (int64_t l : load) mean += double(l);
  mean /= double(load.size());
  for (size_t i = 0; i < bias.size(); i++) {
    const double d = mean - double(load[i]);
    bias[i] += d > 0 ? rate : d < 0 ? -rate : 0.f;
  }
}

double load_imbalance(const std::vector<int64_t>& load) {
  if (load.empty()) return 0;
  double sum = 0, mx = 0;
  for (int64_t l : load) sum += double(l), mx = std::max(mx, double(l));
  return sum > 0 ? mx / (sum / double(load.size())) - 1.0 : 0.0;
}

}  // namespace mt::moe
