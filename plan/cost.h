// The planner's communication and time models.
//
// Bytes per step on each group (parallel/comm.h's sent_bytes: what this rank sends under a ring or
// pairwise algorithm), op by op, from the code that sends them:
//   dp (the replicas, dp x cp)  ZeRO 0-1: all-reduce of the gradient, 2(D-1)/D P x 4 (in buckets
//                               that are multiples of D, so the sum is exact); ZeRO 1-2: all-gather of
//                               the updated compute weights, (D-1)/D P x cb; ZeRO 2-3: reduce-scatter
//                               of the gradient every micro-batch, (D-1)/D P x 4; ZeRO-3: each unit
//                               gathered before each use, as the unit events replay it; the embedding's
//                               sparse gradient as rows (ZeRO 0-2 on the CPU); scalars (loss, norms)
//   tp                          sequence parallelism: 4 collectives of (N, C)/tp per layer each way,
//                               the embedding's and classifier's, the LayerNorm outputs gathered again
//                               in backward, the softmax statistics, the partial gradients of the
//                               replicated LayerNorms and positions; without sp all-reduces of (N, C);
//                               a mixture layer's MLP none (it runs whole on each tp rank), its
//                               router's and experts' gradients partial under sp, and the token
//                               group's gathers of loads and (with a capacity) choices
//   cp                          ring attention: cp - 1 key/value blocks each way, the fp32 dK/dV
//                               accumulators once round the ring in backward (ring_attention.h)
//   pp                          one (N, C) activation forward and one gradient backward per
//                               micro-batch and stage boundary; the tied embedding's gradient
//                               exchanged between the first and last stage
// The time model: GEMM FLOPs at the dtype's peak, memory-bound bytes (LayerNorms, GELU, residuals,
// softmax, the optimizer) at the memory bandwidth, each collective as latency x ring steps + sent
// bytes / link bandwidth (alpha-beta), the pipeline bubble from the schedule simulator, the
// data-parallel reduction hidden behind backward by the hardware's dp_overlap.
#pragma once
#include <string>

#include "parallel/comm.h"
#include "plan/hardware.h"
#include "plan/memory.h"

namespace mt::plan {

struct CommPlan {
  parallel::CommCounters dp, tp, cp, pp;  // per step, for the rank shown (group rank 0; dp: dp_rank)
  // The scalar collectives among them (loss, norms, flags), which the time model prices as small
  // messages (logarithmic latency) rather than as rings.
  parallel::CommCounters dp_scalars, tp_scalars, pp_scalars;
  // Expert parallelism's token exchange (balanced routing, no drops) and its norm scalar.
  parallel::CommCounters ep, ep_scalars;
};
// dp_rank: the rank's index in its dp x cp group (a few small reductions whose length does not divide
// the group, the routing statistics' counts and fp16's flag, send a rank-dependent share).
CommPlan plan_comm(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank, int dp_rank = 0);

struct TimePlan {
  double gemm_s = 0, attention_s = 0, memory_s = 0;  // compute per step (one rank): GEMMs, attention
  double optimizer_s = 0, grad_passes_s = 0;          // products, memory-bound ops, the update, and the
                                                      // passes over whole gradients (zeroing, norms)
  double tp_s = 0, cp_s = 0, pp_s = 0, dp_s = 0, ep_s = 0;  // communication per step
  double dp_exposed_s = 0;                           // the part not hidden behind backward
  double bubble = 0;                                 // pipeline bubble / ideal time (simulator)
  double step_s = 0;
  double tokens_per_step = 0;  // global
  double flops_per_token = 0;  // model FLOPs (6 N_matmul + 12 L C T, active parameters for MoE)
  double hw_flops_per_token = 0;  // with recompute
  double mfu = 0;
  double tokens_per_s() const { return step_s > 0 ? tokens_per_step / step_s : 0; }
};
// `mem`: the plan's memory figures (its optimizer shard sizes the update); `pipe`: the schedule's.
TimePlan plan_time(const config::TrainOptions& o, const parallel::MeshLayout& l, const Hardware& hw, const CommPlan& comm,
                   const MemoryPlan& mem, const PipelineFigures& pipe);

}  // namespace mt::plan
