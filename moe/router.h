// The router of a mixture-of-experts layer, in fp32 on the host: logits z = x W^T (W: (E, C)), the
// softmax p over the E experts, and for each token its top-k experts with their gates.
//
//   choice   the k largest scores p_i + b_i (b: the routing bias, zero unless balance = bias), ties
//            to the lower expert index, so a routing is a pure function of its inputs;
//   gates    k > 1: the chosen probabilities renormalised to sum to one (Mixtral); k = 1: p_e itself
//            (Switch Transformer: a gate of 1 would leave the router no gradient from the loss);
//   balance  A = E sum_i f_i P_i (Switch Transformer, Fedus et al. 2021, eq. 4), f_i the fraction of
//            the N k assignments that chose expert i, P_i the mean of p_i over the N tokens; A = 1
//            when both are uniform. Its gradient flows through P only (f is a count);
//   z-loss   Z = mean over tokens of logsumexp(z)^2 (ST-MoE, Zoph et al. 2022, eq. 5): keeps the
//            logits small;
//   bias     aux-loss-free balancing (DeepSeek-V3, Wang et al. 2024): after each step
//            b_i += gamma sign(mean load - load_i); b only chooses experts, gates come from p.
//
// The router is one GEMM (N, C) x (C, E) forward and two backward (ops::matmul_*): its backward is
// local, no collective pairs with it on one rank; its bytes are N E 4 for the logits.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace mt::moe {

// What one micro-batch's routing decided, with what its backward needs.
struct Routing {
  int N = 0, E = 0, K = 0;
  std::vector<float> probs;     // (N, E) softmax of the logits
  std::vector<float> lse;       // (N) logsumexp of the logits
  std::vector<int32_t> expert;  // (N, K) chosen experts, best first
  std::vector<float> gate;      // (N, K)
  std::vector<int64_t> load;    // (E) assignments per expert (before any capacity)
  double balance = 0;           // A = E sum_i f_i P_i
  double z = 0;                 // Z = mean lse^2
};

// logits (N, E) -> routing. `bias` (E) or nullptr (no routing bias). Host arrays: the arithmetic is
// the CPU twin of the ops (kernels/cpu/moe.cpp); the model calls ops::moe_route on either backend.
Routing route(const float* logits, const float* bias, int N, int E, int K);
// balance and z of r (N, E, K and load set) from ops::moe_route_stats's sums: sum_t p_{t,i} (E), then
// sum_t lse_t^2.
void route_summary(Routing& r, const double* sums);

// The gradient of the objective J = sum_{t,j} dgate[t,j]-weighted gates + aux_weight A + z_weight Z
// with respect to the logits: dlogits (N, E) is assigned. `dgate` (N, K): dJ/dgate.
void route_backward(float* dlogits, const float* dgate, const Routing& r, double aux_weight, double z_weight);

// The router as a whole: x (N, C) fp32, w (E, C) fp32. logits (N, E) assigned.
void router_logits(float* logits, const float* x, const float* w, int N, int C, int E, const ops::Ctx& ctx);
// dx (N, C) assigned (skipped if nullptr; w is read for it only), dw (E, C) accumulated (skipped if
// nullptr): zb1's split backward makes the two in separate calls, the same bits as one.
void router_logits_backward(float* dx, float* dw, const float* dlogits, const float* x, const float* w, int N, int C,
                            int E, const ops::Ctx& ctx);

// DeepSeek-V3's update after a step: b_i += rate sign(mean(load) - load_i).
void update_bias(std::vector<float>& bias, const std::vector<int64_t>& load, float rate);

// Worst imbalance max_i load_i / mean(load) - 1 (0: perfectly balanced; 0 for no load).
double load_imbalance(const std::vector<int64_t>& load);

}  // namespace mt::moe
