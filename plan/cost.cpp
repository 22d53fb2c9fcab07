#include "plan/cost.h"

#include <algorithm>
#include <cmath>

#include "config/layout_rules.h"
#include "model/config.h"

namespace mt::plan {
namespace {

using parallel::CommCounters;
using parallel::CommOp;

void add(CommCounters& c, CommOp op, uint64_t calls, uint64_t sent) {
  c[op].calls += calls;
  c[op].sent_bytes += sent;
}

// The scalar collectives (the loss, norms and flags: a few doubles each) count in the group's traffic
// and also in `scalars`, which the time model prices as the small host messages they are.
void add_scalars(CommCounters& c, CommCounters& scalars, CommOp op, uint64_t calls, uint64_t sent) {
  add(c, op, calls, sent);
  add(scalars, op, calls, sent);
}

// Rows of a micro-batch on one rank: B T / cp tokens.
int64_t rows_per_micro(const config::TrainOptions& o, const parallel::MeshLayout& l) { return int64_t(o.batch_size) * o.seq_len / l.cp; }

// Whether the gradient noise scale comes from each replica's own gradient (train/trainer.cpp
// update_noise_scale): several replicas, and a rank that held its whole local gradient (ZeRO 0-1, or
// ZeRO-2 with one micro-batch). Under pp both of its norms are also summed over the stages (and tp).
bool noise_from_ranks(const config::TrainOptions& o, const parallel::MeshLayout& l) {
  const int zero = o.parallel.zero;
  return l.dp * l.cp > 1 && (zero <= 1 || (zero == 2 && o.grad_accum == 1));
}

// The noise scale leaves experts held apart out of both its norms (train/trainer.cpp): their squared
// norm summed over tp and pp once more, unless the embeddings went as rows (a norm from the first unit).
bool noise_leaves_experts_out(const config::TrainOptions& o, const parallel::MeshLayout& l) {
  return l.ep > 1 && o.model.moe.enabled() && !plan_embedding_rows(o, l);
}

// The step's routing statistics (train/trainer_moe.cpp), summed over a group of `n` ranks: per
// mixture layer of the whole model the loads, assignments, drops and tokens as one int32 all-reduce,
// the balance and z sums as doubles. Over dp x cp, then tp under sp (each tp rank routed its own
// rows), then pp.
void moe_step_statistics(CommCounters& c, CommCounters& scalars, const config::TrainOptions& o, int n, int rank) {
  if (!o.model.moe.enabled()) return;
  int layers = 0;
  for (int k = 0; k < o.model.n_layer; k++) layers += o.model.is_moe_layer(k);
  add_scalars(c, scalars, CommOp::all_reduce, 1,
              parallel::all_reduce_sent_bytes(size_t(layers) * size_t(o.model.moe.experts + 3), 4, n, rank));
  add_scalars(c, scalars, CommOp::all_gather, uint64_t(2 * layers), uint64_t(2 * layers) * uint64_t(n - 1) * 8);
}

// Expert parallelism's routed experts held apart: their own data parallelism over the expert-data
// group (E = D / ep ranks), counted with the dp group's traffic as Trainer::group_counters does. The
// same rules as the dense units' (no embedding rows); its scalars: the sharded norm's double from
// ZeRO-1 on, fp16's finiteness flag.
// ed_rank: the rank's index in its expert-data group (the dp x cp index over ep).
void expert_data_traffic(CommCounters& c, CommCounters& scalars, const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank,
                         int ed_rank) {
  const std::vector<int64_t> units = plan_expert_units(o, l, pp_rank);
  const int E = l.dp * l.cp / std::max(l.ep, 1), zero = o.parallel.zero, m = o.grad_accum;
  if (units.empty() || E == 1) return;
  uint64_t P = 0;
  for (int64_t n : units) P += uint64_t(n);
  const uint64_t cb = dtype_size(o.precision), e1 = uint64_t(E - 1);
  if (zero <= 1)
    add(c, CommOp::all_reduce, 1, parallel::all_reduce_sent_bytes(size_t(P), 4, E, 0));
  else
    add(c, CommOp::reduce_scatter, uint64_t(m) * units.size(), uint64_t(m) * e1 * (P / uint64_t(E)) * 4);
  if (zero == 1 || zero == 2) add(c, CommOp::all_gather, units.size(), e1 * (P / uint64_t(E)) * cb);
  if (zero == 3) {
    const std::vector<int> g = plan_expert_unit_gathers(o, l, pp_rank);
    for (size_t u = 0; u < units.size(); u++)
      add(c, CommOp::all_gather, uint64_t(g[u]), uint64_t(g[u]) * e1 * uint64_t(units[u] / E) * cb);
  }
  if (zero >= 1) add_scalars(c, scalars, CommOp::all_gather, 1, e1 * 8);
  if (o.precision == DType::f16 && zero >= 1)
    add_scalars(c, scalars, CommOp::all_reduce, 1, parallel::all_reduce_sent_bytes(1, 4, E, ed_rank));
}

CommCounters dp_traffic(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank, int dp_rank, CommCounters& scalars) {
  CommCounters c;
  const int D = l.dp * l.cp, zero = o.parallel.zero, m = o.grad_accum;
  if (D == 1) return c;
  const std::vector<int64_t> units = plan_units(o, l, pp_rank);
  uint64_t P = 0;
  for (int64_t n : units) P += uint64_t(n);
  const uint64_t cb = dtype_size(o.precision), d1 = uint64_t(D - 1);
  if (zero <= 1) {
    // Buckets of whole units (each a multiple of D): the sum is the formula for the whole gradient.
    add(c, CommOp::all_reduce, 1, parallel::all_reduce_sent_bytes(size_t(P), 4, D, 0));
  } else {
    add(c, CommOp::reduce_scatter, uint64_t(m) * units.size(), uint64_t(m) * d1 * (P / uint64_t(D)) * 4);
  }
  if (zero == 1 || zero == 2) add(c, CommOp::all_gather, units.size(), d1 * (P / uint64_t(D)) * cb);
  if (zero == 3) {
    const std::vector<int> g = plan_unit_gathers(o, l, pp_rank);
    for (size_t u = 0; u < units.size(); u++)
      add(c, CommOp::all_gather, uint64_t(g[u]), uint64_t(g[u]) * d1 * uint64_t(units[u] / D) * cb);
  }
  if (plan_embedding_rows(o, l)) {
    // wte's and wpe's rows: N ids and N x C fp32 values each, in the step's last micro-batch.
    const uint64_t N = uint64_t(rows_per_micro(o, l)), C = uint64_t(o.model.n_embd);
    add(c, CommOp::all_gather, 4, 2 * d1 * (N * 4 + N * C * 4));
  }
  // Scalars as 8-byte doubles: the loss sum; from ZeRO-1 the squared norm of the sharded gradient; the
  // noise scale's per-rank norm and, when the embeddings went as rows under ZeRO 1-2 or under pp, the
  // global norm over the parameters it covers.
  const bool noise = noise_from_ranks(o, l);
  const int doubles = 1 + (zero >= 1) + noise + (noise && (plan_embedding_rows(o, l) || l.pp > 1) && zero >= 1);
  add_scalars(c, scalars, CommOp::all_gather, uint64_t(doubles), uint64_t(doubles) * d1 * 8);
  if (o.precision == DType::f16 && zero >= 1)
    add_scalars(c, scalars, CommOp::all_reduce, 1, parallel::all_reduce_sent_bytes(1, 4, D, dp_rank));
  moe_step_statistics(c, scalars, o, D, dp_rank);
  expert_data_traffic(c, scalars, o, l, pp_rank, dp_rank / std::max(l.ep, 1));
  return c;
}

// A mixture layer whose micro-batch is spread over ranks (moe/token_group.h: cp, and tp under sp)
// gathers every rank's loads and probability sums (2E doubles) over that token group, over tp first
// and then the tp block over cp; with a capacity, every rank's expert choices (N_s K i32, N_s its rows)
// the same way. Once per mixture layer of this stage, micro-batch and forward (full recompute runs the
// forward again in backward). `cp`: the cp group's gathers, else the tp group's.
void moe_group_gathers(CommCounters& c, const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank,
                       bool cp) {
  const uint64_t Pt = o.sequence_parallel() ? uint64_t(l.tp) : 1, Pc = uint64_t(l.cp);
  if (!o.model.moe.enabled() || (cp ? Pc : Pt) == 1) return;
  const model::StagePlan plan = l.pp > 1 ? config::stage_plan(o, pp_rank) : model::StagePlan::whole(o.model.n_layer);
  uint64_t layers = 0;
  for (const auto& k : plan.chunks)
    for (int layer = k.begin; layer < k.end; layer++) layers += o.model.is_moe_layer(layer);
  const uint64_t Ns = uint64_t(rows_per_micro(o, l)) / Pt, K = uint64_t(o.model.moe.top_k);
  const uint64_t E = uint64_t(o.model.moe.experts), drops = o.model.moe.capacity > 0 ? 1 : 0;
  const uint64_t times = uint64_t(o.grad_accum) * layers * (o.recompute == model::Recompute::full ? 2 : 1);
  // Each gather sends (n - 1) copies of what it holds: its own block over tp, tp's block over cp.
  const uint64_t held = cp ? Pt : 1, others = (cp ? Pc : Pt) - 1;
  add(c, CommOp::all_gather, times * (1 + drops), times * others * held * (2 * E * 8 + drops * Ns * K * 4));
}

CommCounters tp_traffic(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank, CommCounters& scalars) {
  CommCounters c;
  const int P = l.tp;
  if (P == 1) return c;
  const model::StagePlan plan = l.pp > 1 ? config::stage_plan(o, pp_rank) : model::StagePlan::whole(o.model.n_layer);
  int L = 0, Lm = 0;  // the stage's layers, and its mixture layers among them
  for (const auto& k : plan.chunks)
    for (int layer = k.begin; layer < k.end; layer++) L++, Lm += o.model.is_moe_layer(layer);
  const uint64_t m = uint64_t(o.grad_accum), N = uint64_t(rows_per_micro(o, l)), C = uint64_t(o.model.n_embd);
  const uint64_t cb = dtype_size(o.precision), p1 = uint64_t(P - 1);
  const uint64_t act = N * C * cb;
  const bool full = o.recompute == model::Recompute::full;
  // Per pass 4 per layer (a layer's forward again under full recompute), the embedding's and the
  // classifier's; in backward the two LayerNorm outputs gathered again. A mixture layer is not split
  // over tp (model/gpt_moe.cpp): its MLP has no collective, so 2 of its 4 blocks and 1 regather go.
  const uint64_t blocks = uint64_t(4 * L - 2 * Lm + (full ? 2 * L - Lm : 0) + plan.first + plan.last);
  const uint64_t stats = plan.last ? p1 * N * 3 * 4 : 0;  // softmax statistics (3 floats per row)
  if (o.sequence_parallel()) {
    const uint64_t regathers = uint64_t(2 * L - Lm);  // under full recompute the re-run forward's serve
    // (P - 1) / P of a block each, exact: n_embd, and so act, is a multiple of P. Divided first, the
    // product stays within 64 bits at the bounds of config/limits.h.
    const uint64_t sent = p1 * (act / uint64_t(P));
    add(c, CommOp::reduce_scatter, m * blocks, m * blocks * sent);
    add(c, CommOp::all_gather, m * (blocks + regathers), m * (blocks + regathers) * sent);
    // Partial gradients, one all-reduce per run of adjacent partial entries of a unit
    // (parallel/tensor_parallel.cpp): the replicated LayerNorms (weight and bias), and of wpe. In a
    // mixture layer the second LayerNorm runs on into the router and the experts the store holds
    // (the shared ones, and the routed ones unless ep holds them apart, in a unit of their own per
    // layer: one more run). Entries of a multiple of 16 elements, as n_embd is here, stay adjacent.
    const model::MoeConfig& mc = o.model.moe;
    const uint64_t mlp = 8 * C * C + 5 * C, E = uint64_t(mc.experts);
    const bool apart = l.ep > 1 && mc.enabled();
    std::vector<uint64_t> partial(size_t(2 * (L - Lm)), 2 * C);
    for (int k = 0; k < Lm; k++) {
      partial.push_back(2 * C);
      partial.push_back(2 * C + E * C + (uint64_t(mc.shared) + (apart ? 0 : E)) * mlp);
      if (apart) partial.push_back(E / uint64_t(l.ep) * mlp);
    }
    if (plan.last) partial.push_back(2 * C);
    if (plan.first) partial.push_back(uint64_t(o.model.block_size) * C);
    for (uint64_t n : partial) add(c, CommOp::all_reduce, 1, parallel::all_reduce_sent_bytes(size_t(n), 4, P, 0));
  } else {
    add(c, CommOp::all_reduce, m * blocks, m * blocks * parallel::all_reduce_sent_bytes(size_t(N * C), cb, P, 0));
  }
  if (stats) add(c, CommOp::all_gather, m, m * stats);
  // The squared gradient norm, and the noise scale's per-replica norm summed over the replica's tp ranks
  // (under pp also its global norm without the tied wte; with experts held apart, their share, which
  // both of its norms leave out).
  const uint64_t doubles = 1 + uint64_t(noise_from_ranks(o, l)) * ((l.pp > 1 ? 2 : 1) + noise_leaves_experts_out(o, l));
  add_scalars(c, scalars, CommOp::all_gather, doubles, doubles * p1 * 8);
  if (o.precision == DType::f16) add_scalars(c, scalars, CommOp::all_reduce, 1, parallel::all_reduce_sent_bytes(1, 4, P, 0));
  if (o.sequence_parallel()) moe_step_statistics(c, scalars, o, P, 0);
  moe_group_gathers(c, o, l, pp_rank, false);
  return c;
}

CommCounters cp_traffic(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank) {
  CommCounters c;
  if (l.cp == 1) return c;
  const model::StagePlan plan = l.pp > 1 ? config::stage_plan(o, pp_rank) : model::StagePlan::whole(o.model.n_layer);
  int L = 0;
  for (const auto& k : plan.chunks) L += k.end - k.begin;
  const uint64_t P = uint64_t(l.cp), Nl = uint64_t(rows_per_micro(o, l)), W = uint64_t(o.model.n_embd / l.tp);
  const uint64_t cb = dtype_size(o.precision);
  const uint64_t kv = Nl * 2 * W * cb, kv32 = Nl * 2 * W * 4;
  const uint64_t docs = o.data.doc_mask ? (P - 1) * Nl * 4 : 0;  // each way
  const uint64_t fwd = (P - 1) * kv + docs, bwd = (P - 1) * kv + P * kv32 + docs;
  const uint64_t passes = o.recompute == model::Recompute::full ? 2 : 1;
  add(c, CommOp::send, uint64_t(o.grad_accum) * L * ((P - 1) * (passes + 1) + P),
      uint64_t(o.grad_accum) * uint64_t(L) * (passes * fwd + bwd));
  moe_group_gathers(c, o, l, pp_rank, true);
  return c;
}

CommCounters pp_traffic(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank, CommCounters& scalars) {
  CommCounters c;
  if (l.pp == 1) return c;
  const model::StagePlan plan = config::stage_plan(o, pp_rank);
  const uint64_t m = uint64_t(o.grad_accum), N = uint64_t(rows_per_micro(o, l)), C = uint64_t(o.model.n_embd);
  const uint64_t Ns = o.sequence_parallel() ? N / uint64_t(l.tp) : N;
  const uint64_t msg = Ns * C * dtype_size(o.precision);
  // Every chunk boundary this rank owns: a forward send per chunk that is not the model's last stage,
  // a backward send per chunk that is not the first.
  const uint64_t v = uint64_t(plan.chunks.size());
  const uint64_t fwd = v - (plan.last ? 1 : 0), bwd = v - (plan.first ? 1 : 0);
  add(c, CommOp::send, m * (fwd + bwd), m * (fwd + bwd) * msg);
  if (plan.first || plan.last) {
    const uint64_t wte = uint64_t(o.model.padded_vocab() / l.tp) * C * 4;
    add(c, CommOp::send, 1, wte);
  }
  // The loss (on the last stage) and the squared gradient norm summed over the stages as doubles; with
  // the noise scale, its per-replica norm and its global norm without the tied wte too (and the
  // experts' share, as over tp).
  const uint64_t doubles = 2 + uint64_t(noise_from_ranks(o, l)) * (2 + noise_leaves_experts_out(o, l));
  add_scalars(c, scalars, CommOp::all_gather, doubles, doubles * uint64_t(l.pp - 1) * 8);
  if (o.precision == DType::f16)
    add_scalars(c, scalars, CommOp::all_reduce, 1, parallel::all_reduce_sent_bytes(1, 4, l.pp, 0));
  moe_step_statistics(c, scalars, o, l.pp, 0);
  return c;
}

// Bytes of the step's passes over whole gradients outside backward and the optimizer (train/trainer.cpp,
// parallel/data_parallel.cpp): zeroing them (the full buffer once a step at ZeRO 0-1; the shard from
// ZeRO-1 on, and at ZeRO 2-3 each unit's gradient buffer as it is allocated, every micro-batch), the
// clipping norm (over the shard from ZeRO-1 on), and the noise scale's
// norms (each replica's own gradient, and the second norm over the shard where the embeddings went as
// rows or under pp). `shard`: elements of the optimizer's shard of pipeline rank `pp_rank`.
double grad_pass_bytes(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank, double shard) {
  double local = 0;
  for (int64_t n : plan_units(o, l, pp_rank)) local += double(n);
  const int zero = o.parallel.zero;
  const double norm_over = zero >= 1 ? shard : local;
  double b = (zero <= 1 ? local : o.grad_accum * local) + (zero >= 1 ? shard : 0) + norm_over;
  const bool from_micro = l.dp * l.cp == 1 && o.grad_accum > 1 && zero <= 1 && l.tp == 1 && l.pp == 1;
  if (from_micro || noise_from_ranks(o, l)) b += local;
  if (noise_from_ranks(o, l) && (plan_embedding_rows(o, l) || l.pp > 1) && zero >= 1) b += shard;
  return 4.0 * b;
}

// Expert parallelism's token exchange on the ep group, for balanced routing and no drops (the real
// figure follows the routing; docs/perf.md compares the two): per mixture layer of this stage and
// micro-batch a counts exchange ((ep-1) E/ep i32) and the rows to the experts' ranks and back, in
// forward and again as gradients in backward, (ep-1)/ep of the N k assigned rows each way (C values
// in the storage type); full recompute repeats the forward's exchanges. Once a step the experts'
// share of the gradient norm is gathered over the group (a double).
CommCounters ep_traffic(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank, CommCounters& scalars) {
  CommCounters c;
  if (l.ep <= 1 || !o.model.moe.enabled()) return c;
  const model::StagePlan plan = l.pp > 1 ? config::stage_plan(o, pp_rank) : model::StagePlan::whole(o.model.n_layer);
  uint64_t layers = 0;
  for (const auto& k : plan.chunks)
    for (int layer = k.begin; layer < k.end; layer++) layers += o.model.is_moe_layer(layer);
  const uint64_t ep = uint64_t(l.ep), e1 = ep - 1, m = uint64_t(o.grad_accum);
  const uint64_t N = uint64_t(rows_per_micro(o, l)) / (o.sequence_parallel() ? uint64_t(l.tp) : 1);
  const uint64_t NK = N * uint64_t(o.model.moe.top_k), C = uint64_t(o.model.n_embd);
  const uint64_t passes = o.recompute == model::Recompute::full ? 2 : 1;
  const uint64_t counts = e1 * uint64_t(o.model.moe.experts) / ep * 4;
  // One way, one exchange: (ep - 1) / ep of the N k rows, rounded down as the integer formula does (in
  // 128 bits: N k (ep - 1) can pass 2^64 at the bounds of config/limits.h, the quotient cannot).
  const uint64_t rows = uint64_t((unsigned __int128)NK * e1 / ep) * C * dtype_size(o.precision);
  add(c, CommOp::all_to_all, m * layers * (3 * passes + 2), m * layers * (passes * counts + (2 * passes + 2) * rows));
  add_scalars(c, scalars, CommOp::all_gather, 1, e1 * 8);
  return c;
}

// Latency steps of each op for the alpha term: rings (n - 1 steps per pass, every step as slow as its
// slowest hop), except that an all-reduce takes the cheaper of a ring's 2 (n - 1) steps and a tree's
// 2 ceil(log2 n) (up and down; NCCL's double binary trees keep a ring's bandwidth at a tree's
// latency). Scalar collectives (`small`): ceil(log2 n) steps, twice for an all-reduce (MPI libraries
// move small messages by recursive doubling or Bruck's algorithm).
double latency_steps(CommOp op, int n, bool small) {
  const double log_steps = std::ceil(std::log2(double(n)));
  if (small) return op == CommOp::all_reduce ? std::min(2.0 * (n - 1), 2 * log_steps) : std::min(n - 1.0, log_steps);
  switch (op) {
    case CommOp::all_reduce: return std::min(2.0 * (n - 1), 2 * log_steps);
    case CommOp::reduce_scatter:
    case CommOp::all_gather:
    case CommOp::broadcast: return n - 1;
    default: return 1;
  }
}

// alpha-beta per op; a reduction also reads two operands and writes one for each element it sums,
// at the memory bandwidth (the host reductions of the CPU backend; on a GPU a small share). `small`:
// c holds scalar collectives only.
double comm_seconds(const CommCounters& c, int n, const LinkSpec& link, double memory_bytes_per_s, bool small = false) {
  double t = 0;
  for (int op = 0; op < parallel::kNumCommOps; op++) {
    const parallel::CommOpCount& k = c[CommOp(op)];
    t += double(k.calls) * latency_steps(CommOp(op), n, small) * link.latency_s + double(k.sent_bytes) / link.bytes_per_s;
    if (CommOp(op) == CommOp::all_reduce || CommOp(op) == CommOp::reduce_scatter)
      t += 3.0 * double(k.sent_bytes) / memory_bytes_per_s;
  }
  return t;
}

// A group's traffic priced in two parts: the scalar collectives over all `n` ranks of the group as
// small messages, the rest as rings of `ring` ranks (2 for the pipeline's neighbour messages).
double group_seconds(const CommCounters& c, const CommCounters& scalars, int n, int ring, const LinkSpec& link,
                     double memory_bytes_per_s) {
  CommCounters rest = c;
  for (int op = 0; op < parallel::kNumCommOps; op++) {
    rest[CommOp(op)].calls -= scalars[CommOp(op)].calls;
    rest[CommOp(op)].sent_bytes -= scalars[CommOp(op)].sent_bytes;
  }
  return comm_seconds(rest, ring, link, memory_bytes_per_s) + comm_seconds(scalars, n, link, memory_bytes_per_s, true);
}

}  // namespace

CommPlan plan_comm(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank, int dp_rank) {
  CommPlan c;
  c.dp = dp_traffic(o, l, pp_rank, dp_rank, c.dp_scalars);
  c.tp = tp_traffic(o, l, pp_rank, c.tp_scalars);
  c.cp = cp_traffic(o, l, pp_rank);
  c.pp = pp_traffic(o, l, pp_rank, c.pp_scalars);
  c.ep = ep_traffic(o, l, pp_rank, c.ep_scalars);
  return c;
}

TimePlan plan_time(const config::TrainOptions& o, const parallel::MeshLayout& l, const Hardware& hw, const CommPlan& comm,
                   const MemoryPlan& mem, const PipelineFigures& pipe) {
  TimePlan t;
  const model::GPTConfig& m = o.model;
  const double W = l.world();
  t.tokens_per_step = double(o.batch_size) * o.seq_len * o.grad_accum * l.dp;
  t.flops_per_token = m.flops_per_token(o.seq_len);
  t.hw_flops_per_token = model::hardware_flops_per_token(m, o.seq_len, o.recompute, o.attention_kind(), o.device);
  // Each rank runs 1/(tp pp) of the model on 1/(dp cp) of the tokens: the attention products at the
  // attention kernels' rate, the rest at the GEMM rate.
  const bool flash = o.attention_kind() == model::Attention::flash;
  const double attn = model::attention_flops_per_token(m, o.seq_len, o.recompute, o.attention_kind(), o.device);
  t.gemm_s = (t.hw_flops_per_token - attn) * t.tokens_per_step / W / hw.flops_for(o.precision);
  t.attention_s = attn * t.tokens_per_step / W / hw.attention_flops_for(flash, o.precision);
  // Memory-bound ops per token and layer, in elements of the residual width: LayerNorms (2 x 2),
  // GELU (2 x 4), residual adds (2 x 3), bias adds (3 + 4) in forward; backward about twice that.
  const double cb = double(dtype_size(o.precision));
  const double C = m.n_embd, L = m.n_layer, T = o.seq_len;
  double per_token = 3.0 * 25.0 * C * cb * L;
  if (o.attention_kind() == model::Attention::materialized)
    per_token += 3.0 * 4.0 * m.n_head * (T / l.cp) * 4.0 * L;  // the probabilities, written and read (fp32)
  per_token += 3.0 * 3.0 * m.padded_vocab() * cb;               // the logits: written, softmax, gradient
  const double act_bytes = per_token * t.tokens_per_step / W;
  const double shard = double(mem.bytes[size_t(MemCategory::optimizer)]) / 8.0;  // elements of m (and v)
  t.memory_s = act_bytes / hw.memory_bytes_per_s;
  t.optimizer_s = shard * (28.0 + cb) / hw.optimizer_rate();  // read m, v, master, grad; write m, v, master, copy
  t.grad_passes_s = grad_pass_bytes(o, l, mem.pp_rank, shard) / hw.reduction_rate();
  const double bw = hw.memory_bytes_per_s;
  t.tp_s = group_seconds(comm.tp, comm.tp_scalars, l.tp, l.tp, hw.link_for_span(l.tp), bw);
  t.cp_s = comm_seconds(comm.cp, l.cp, hw.link_for_span(l.tp * l.cp), bw);
  t.pp_s = group_seconds(comm.pp, comm.pp_scalars, l.pp, 2, hw.link_for_span(l.tp * l.cp * l.pp), bw);
  t.dp_s = group_seconds(comm.dp, comm.dp_scalars, l.dp * l.cp, l.dp * l.cp, hw.link_for_span(l.world()), bw);
  // The ep group: ep consecutive ranks of the cp x dp index, every other dimension inside them.
  t.ep_s = group_seconds(comm.ep, comm.ep_scalars, l.ep, l.ep, hw.link_for_span(l.tp * l.cp * l.pp * l.ep), bw);
  t.dp_exposed_s = t.dp_s * (1.0 - hw.dp_overlap);
  t.bubble = pipe.bubble_over_ideal;
  const double per_micro_work = t.gemm_s + t.attention_s + t.memory_s + t.tp_s + t.cp_s + t.ep_s;
  t.step_s = per_micro_work * (1.0 + t.bubble) + t.pp_s + t.dp_exposed_s + t.optimizer_s + t.grad_passes_s;
  t.mfu = t.step_s > 0 ? t.flops_per_token * t.tokens_per_step / (t.step_s * W * hw.flops_for(o.precision)) : 0;
  return t;
}

}  // namespace mt::plan
