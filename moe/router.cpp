#include "moe/router.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
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
  std::vector<double> lse_sq(static_cast<size_t>(N)), sums(size_t(E) + 1);
  cpu::moe_route(r.probs.data(), r.lse.data(), lse_sq.data(), r.expert.data(), r.gate.data(), logits, bias, N, E, K);
  cpu::moe_route_stats(sums.data(), r.probs.data(), lse_sq.data(), N, E);
  r.load.assign(size_t(E), 0);
  for (int32_t e : r.expert) r.load[size_t(e)]++;
  route_summary(r, sums.data());
  return r;
}

void route_summary(Routing& r, const double* sums) {
  if (r.N == 0) return;
  const int N = r.N, E = r.E, K = r.K;
  double a = 0;
  for (int i = 0; i < E; i++) a += double(r.load[size_t(i)]) / (double(N) * K) * (sums[i] / N);
  r.balance = E * a;
  r.z = sums[E] / N;
}

void route_backward(float* dlogits, const float* dgate, const Routing& r, double aux_weight, double z_weight) {
  const std::vector<int32_t> load(r.load.begin(), r.load.end());
  cpu::moe_route_bwd(dlogits, dgate, r.probs.data(), r.lse.data(), r.expert.data(), r.gate.data(), load.data(), r.N,
                     r.E, r.K, aux_weight, z_weight);
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
