// A mixture-of-experts MLP inside a GPT layer, in the run's storage type S (moe/ has the pieces):
//
//   forward   logits = ln2 W_r^T in fp32 -> routing (top-k, gates, the bias chooses) -> dispatch plan
//             (capacity, drops) -> rows = ln2 permuted by expert -> each expert's MLP on its rows ->
//             x_next = res2 + sum of the shared experts' MLPs + the gate-weighted combine;
//   backward  the combine's backward gives the rows' and the gates' gradients; the experts' backward
//             the permuted input's; the router's backward the logits' (gates, plus the load-balancing
//             loss alpha E sum f_i P_i when balance = aux, plus the z-loss), and from them W_r's and
//             the router input's; dL/d ln2 sums the permuted rows back, the router's and the shared
//             experts' parts in fp32, rounded once;
//   zb1       B_input runs that backward without the weight gradients and keeps the operands they
//             need (MoeGrads: the experts' rows' and hidden states' gradients where the experts are,
//             the logits' gradient, the shared experts' output gradients); W (moe_weight_backward)
//             makes them with the same operations, the unsplit backward's bits, exchanging nothing.
//
// The two extra losses enter the objective as N x (alpha A + beta Z) per micro-batch of N tokens,
// weighted by the pass's dloss like the token losses: their share of the mean loss is that of the
// micro-batch's tokens.
//
// Both backends run this code: the router's top-k, the plan and the moves are ops (kernels/ops.h,
// kernels/cpu/moe.cpp and kernels/cuda/moe.cu) on the run's memory, and the experts' GEMMs are the
// matmul op, one per expert with rows (moe/experts.h). Once per layer, between the plan and the
// experts, the host receives the plan's summary in one copy (the router's statistics, the loads,
// the experts' offsets, each assignment's expert and row: 8 (E + 1) + 4 (2E + 1) + 8 N K bytes): the
// offsets size the experts' GEMMs, the rest feeds the step's routing statistics. Expert parallelism
// moves rows through a host communicator, so it stays on the CPU backend.
//
// Tensor parallelism: the mixture is not split. Each tp rank runs it whole on the rows it holds (its
// 1/tp of them under sequence parallelism, whose weight gradients are then partial sums over tp,
// like a LayerNorm's; all of them, computed alike on every tp rank, without). The balance term A is
// taken over the whole micro-batch either way: under sp from the loads and probability sums of every
// tp rank (balance_over_group).
//
// Context parallelism: each cp rank runs the mixture on its zigzag chunks' rows. The micro-batch's
// tokens are then spread over its token group (cp, and tp under sp; moe/token_group.h), and both of
// the layer's decisions that are not per token are taken over the whole group, as the single-rank run
// of the micro-batch takes them: the balance term from the loads and probability sums of every rank
// of the group; the capacity (ceil(factor N K / E), N the micro-batch's tokens) and the drops from
// every rank's choices in the micro-batch's token order, so that the same assignments are dropped as
// on one rank. The z-loss and the gates are per token and need nothing.
//
// Expert parallelism (GPT::set_expert_parallel, moe/ep_exchange.h; the ep group is carved from dp x cp):
// routing, the plan (capacity, drops, decided as above) and the combine stay with the tokens' rank; only the permuted rows travel, to the ranks holding their
// experts and back, in forward and again (as gradients) in backward. A rank holds its own experts only
// (GPT::expert_store, ExpertPlacement): their gradients are summed over the expert-data group.
#include <type_traits>

#include "model/gpt_pass.h"
#include "moe/experts.h"

namespace mt::model {

namespace {
template <class S>
std::vector<moe::ExpertWeights<S>> expert_weights(const std::vector<MlpParams>& ms, const std::function<const S*(int)>& w) {
  std::vector<moe::ExpertWeights<S>> out;
  for (const MlpParams& m : ms) out.push_back({w(m.fc_w), w(m.fc_b), w(m.proj_w), w(m.proj_b)});
  return out;
}
// This rank's experts under expert parallelism: [rank local, (rank + 1) local).
template <class S>
std::vector<moe::ExpertWeights<S>> local_experts(const LayerParams& lp, const moe::ExpertExchange& x,
                                                 const std::function<const S*(int)>& w) {
  const std::vector<MlpParams> mine(lp.experts.begin() + x.rank * x.local, lp.experts.begin() + (x.rank + 1) * x.local);
  return expert_weights<S>(mine, w);
}
// The plan's arrays inside MoeActs::plan_arrays: the router's sums (E+1 doubles), then i32 load (E),
// offset (E+1), expert (A) and row_of (A), one block so that the host reads it in one copy.
struct PlanView {
  double* sums;
  int32_t *load, *offset, *expert, *row_of;
};
size_t plan_bytes(int E, int64_t A) { return size_t(E + 1) * 8 + size_t(2 * E + 1 + 2 * A) * 4; }
PlanView plan_view(void* base, int E, int64_t A) {
  PlanView v;
  v.sums = static_cast<double*>(base);
  v.load = reinterpret_cast<int32_t*>(v.sums + E + 1);
  v.offset = v.load + E;
  v.expert = v.offset + E + 1;
  v.row_of = v.expert + A;
  return v;
}
PlanView plan_view(const MoeActs& m) {
  return plan_view(m.plan_arrays.data(), m.routing.E, int64_t(m.routing.N) * m.routing.K);
}
}  // namespace

template <class S>
void Pass<S>::route_and_plan(int l, const float* logits, MoeActs& m) {
  const MoeConfig& mc = m_.cfg_.moe;
  const int N = Ns_, E = mc.experts, K = mc.top_k;
  // A micro-batch spread over ranks (cp, or tp under sp) decides its drops over all of its tokens
  // (moe/token_group.h): the op plans this rank's rows dropless, the whole plan then replaces it.
  const moe::TokenGroup group = token_group();
  const bool drops_over_group = group.size() > 1 && mc.capacity > 0;
  const int64_t A = int64_t(N) * K, cap = drops_over_group ? -1 : moe::expert_capacity(mc.capacity, N, K, E);
  Buffer bias, lse_sq = f32(2 * int64_t(N));  // (N) doubles
  if (mc.balance == MoeBalance::bias) {
    bias = f32(E);
    ar_.upload(bias.data(), m_.moe_bias_[size_t(l)].data(), size_t(E) * sizeof(float));
  }
  m.probs = f32(int64_t(N) * E);
  m.lse = f32(N);
  m.gate = f32(A);
  m.plan_arrays = ar_.alloc_uninitialized(kAct, plan_bytes(E, A));
  m.assignment_of = ar_.alloc_uninitialized(kAct, size_t(A) * 4);
  const PlanView v = plan_view(m.plan_arrays.data(), E, A);
  double* sq = static_cast<double*>(lse_sq.data());
  ops::moe_route(m.probs.f32(), m.lse.f32(), sq, v.expert, m.gate.f32(), logits, bias ? bias.f32() : nullptr, N, E, K,
                 c_);
  ops::moe_route_stats(v.sums, m.probs.f32(), sq, N, E, c_);
  ops::moe_plan(v.load, v.offset, v.row_of, m.assignment_of.i32(), v.expert, N, K, E, cap, c_);
  // The one copy to the host: the experts' GEMMs need the offsets, the step's statistics the rest.
  std::vector<double> host(plan_bytes(E, A) / 8 + 1);
  ar_.mem().download(host.data(), m.plan_arrays.data(), plan_bytes(E, A));
  const PlanView h = plan_view(host.data(), E, A);
  moe::Routing& r = m.routing;
  r.N = N, r.E = E, r.K = K;
  r.expert.assign(h.expert, h.expert + A);
  r.load.assign(h.load, h.load + E);
  moe::route_summary(r, h.sums);
  if (group.size() > 1) balance_over_group(m, group, h.sums, h.load);
  moe::DispatchPlan& plan = m.plan;
  if (drops_over_group) {
    // The plan of the whole micro-batch's capacity, this rank's rows laid out as the op lays them out:
    // its offsets, rows and assignments replace the op's in the run's memory (i32, as the op writes them).
    plan = moe::plan_over_group(group, r.expert.data(), N, K, E, mc.capacity);
    const std::vector<int32_t> offset(plan.offset.begin(), plan.offset.end());
    ar_.upload(v.offset, offset.data(), offset.size() * 4);
    ar_.upload(v.row_of, plan.row_of.data(), plan.row_of.size() * 4);
    if (plan.rows() > 0) ar_.upload(m.assignment_of.data(), plan.assignment_of.data(), size_t(plan.rows()) * 4);
    return;
  }
  plan.N = N, plan.K = K, plan.E = E, plan.capacity = cap;
  plan.offset.assign(h.offset, h.offset + E + 1);
  plan.row_of.assign(h.row_of, h.row_of + A);
  plan.dropped = A - plan.rows();
}

// The ranks holding one micro-batch's rows: its cp ranks, and its tp ranks under sequence parallelism
// (each holds its own rows; without sp every tp rank holds all of them).
template <class S>
moe::TokenGroup Pass<S>::token_group() const {
  moe::TokenGroup g;
  if (tp_.splits_sequence()) g.tp = &tp_.comm();
  if (cp_.active()) g.cp = &cp_.comm();
  g.B = B_;
  g.T = T_ * g.cp_size();
  return g;
}

// When a micro-batch's tokens are spread over ranks (cp, or tp under sp), the balance term
// A = E sum f_i P_i takes f and P over all of them: each rank's loads and probability sums, gathered
// bit for bit and added in rank order (moe/token_group.h), so every rank has the same A, the single
// rank's up to the order of that sum. Backward reads the summed loads (MoeActs::balance_load).
template <class S>
void Pass<S>::balance_over_group(MoeActs& m, const moe::TokenGroup& group, const double* sums, const int32_t* load) {
  moe::Routing& r = m.routing;
  const int E = r.E, K = r.K;
  std::vector<double> mine(size_t(2 * E));
  for (int i = 0; i < E; i++) mine[size_t(i)] = sums[i], mine[size_t(E + i)] = double(load[i]);
  const std::vector<double> total = group.sum(mine);
  const double N = double(r.N) * group.size();
  double a = 0;
  std::vector<int32_t> summed(static_cast<size_t>(E));
  for (int i = 0; i < E; i++) {
    a += total[size_t(E + i)] / (N * K) * (total[size_t(i)] / N);
    summed[size_t(i)] = int32_t(total[size_t(E + i)]);
  }
  r.balance = E * a;
  m.balance_load = ar_.alloc_uninitialized(kAct, size_t(E) * 4);
  ar_.upload(m.balance_load.data(), summed.data(), size_t(E) * 4);
}

template <class S>
void Pass<S>::moe_forward(int l, S* x_next, LayerActs& a) {
  const LayerParams& lp = m_.layers_[size_t(l)];
  const MoeConfig& mc = m_.cfg_.moe;
  const int N = Ns_, C = C_, F = 4 * C_, E = mc.experts, K = mc.top_k;  // this rank's rows
  a.moe = std::make_shared<MoeActs>();
  MoeActs& m = *a.moe;
  const S* ln2 = p(a.ln2);
  // The router in fp32: its input and weight widened when the run computes in 16 bits.
  const float* x32 = nullptr;
  Buffer w32;
  const float* wr = nullptr;
  if constexpr (std::is_same_v<S, float>) {
    x32 = ln2;
    wr = w(lp.router_w);
  } else {
    m.x32 = f32(int64_t(N) * C);
    ops::convert(m.x32.f32(), ln2, int64_t(N) * C, c_);
    x32 = m.x32.f32();
    w32 = f32(int64_t(E) * C);
    ops::convert(w32.f32(), w(lp.router_w), int64_t(E) * C, c_);
    wr = w32.f32();
  }
  Buffer logits = f32(int64_t(N) * E);
  moe::router_logits(logits.f32(), x32, wr, N, C, E, c_);
  route_and_plan(l, logits.f32(), m);
  const int64_t M = m.plan.rows();
  m.rows = act(M * C);
  m.out = act(M * C);
  ops::moe_permute(p(m.rows), ln2, m.assignment_of.i32(), M, K, C, c_);
  const std::function<const S*(int)> wf = [&](int i) { return xw(i); };
  MT_CHECK(!m_.experts_.apart() || (m_.ep_ != nullptr && m_.ep_->size() == m_.experts_.ranks),
           "mixture layer %d: experts placed over %d ranks, but the ep group has %d", l, m_.experts_.ranks,
           m_.ep_ ? m_.ep_->size() : 1);
  if (m_.ep_ != nullptr && m_.ep_->size() > 1) {
    // Expert parallelism: the rows to their experts' ranks, this rank's experts, the outputs back.
    parallel::Comm& data = *m_.ep_data_;
    m.ep = true;
    {
      // Named for the op profile: the counts' exchange is where a rank waits for the others to reach
      // this layer, the rows' exchange where it waits for their experts (kEpExchange, ops.h).
      const ops::Region region(c_, ops::kEpExchange);
      m.ex = moe::exchange_counts(m.plan, *m_.ep_);
    }
    const int64_t R = m.ex.rows();
    Buffer mine = act(R * C), out = act(R * C), staging = act(R * C);
    {
      const ops::Region region(c_, ops::kEpExchange);
      moe::to_experts(p(mine), p(m.rows), m.ex, C, data, p(staging), ar_.mem());
    }
    m.rows = std::move(mine);
    m.h_pre = act(R * F);
    m.h = act(R * F);
    moe::experts_forward(p(out), p(m.h_pre), p(m.h), p(m.rows), m.ex.experts, local_experts(lp, m.ex, wf), C, F, c_);
    {
      const ops::Region region(c_, ops::kEpExchange);
      moe::from_experts(p(m.out), p(out), m.ex, C, data, p(staging), ar_.mem());
    }
  } else {
    m.h_pre = act(M * F);
    m.h = act(M * F);
    moe::experts_forward(p(m.out), p(m.h_pre), p(m.h), p(m.rows), m.plan, expert_weights<S>(lp.experts, wf), C, F,
                         c_);
  }
  // The residual and the shared experts, then the routed experts' combine on top (in place).
  const S* base = p(a.res2);
  Buffer tmp;
  for (const MlpParams& sh : lp.shared) {
    m.shared_pre.push_back(act(int64_t(N) * F));
    m.shared_h.push_back(act(int64_t(N) * F));
    if (!tmp) tmp = act(NC_);
    ops::matmul_fwd(p(m.shared_h.back()), ln2, w(sh.fc_w), w(sh.fc_b), N, C, F, c_, p(m.shared_pre.back()));
    ops::matmul_fwd(p(tmp), p(m.shared_h.back()), w(sh.proj_w), w(sh.proj_b), N, F, C, c_);
    ops::add(x_next, base, p(tmp), NC_, c_);
    base = x_next;
  }
  ops::moe_combine(x_next, p(m.out), m.gate.f32(), base, plan_view(m).row_of, N, K, C, c_);
  if (in_backward_) return;  // a recompute: this forward was counted already
  MoeLayerStats& s = m_.moe_stats_[size_t(l)];
  for (int e = 0; e < E; e++) s.load[size_t(e)] += m.routing.load[size_t(e)];
  s.assignments += int64_t(N) * K;
  s.dropped += m.plan.dropped;
  s.tokens += N;
  for (size_t a = 0; a < m.routing.expert.size(); a++)  // FNV-1a over (expert, kept) per assignment
    s.routing_hash = (s.routing_hash ^ uint64_t(m.routing.expert[a] * 2 + (m.plan.row_of[a] >= 0))) * 1099511628211ull;
  s.balance += double(N) * m.routing.balance;
  s.z += double(N) * m.routing.z;
}

template <class S>
void Pass<S>::moe_backward(int l, const S* dx, S* dln, LayerActs& a, MoeGrads* defer) {
  const LayerParams& lp = m_.layers_[size_t(l)];
  const MoeConfig& mc = m_.cfg_.moe;
  const int N = Ns_, C = C_, F = 4 * C_, E = mc.experts, K = mc.top_k;  // this rank's rows
  MT_CHECK(a.moe != nullptr, "mixture layer %d: backward without its forward state", l);
  MoeActs& m = *a.moe;
  const int64_t M = m.plan.rows();
  const S* ln2 = p(a.ln2);
  // zb1's B_input (defer): the same operations without their weight gradients, whose operands stay
  // in *defer (the gradients of the experts' rows and hidden states, the router's logits, the shared
  // experts' outputs) for moe_weight_backward.
  auto gw = [&](int i) { return defer ? nullptr : g(i); };
  auto gwout = [&](int i, int64_t n) { return defer ? ops::GradOut() : gout(i, n); };
  // Combine, then the experts.
  Buffer drows = act(M * C), dgate = f32(int64_t(N) * K);
  const PlanView pv = plan_view(m);
  ops::moe_combine_bwd(p(drows), dgate.f32(), dx, p(m.out), m.gate.f32(), pv.row_of, m.assignment_of.i32(), M, N, K,
                       C, c_);
  Buffer din = act(M * C);
  // Experts first .. first + plan.E - 1, as the plan's experts 0 .. E - 1.
  auto grads_of = [&](int first, const moe::DispatchPlan& plan) {
    std::vector<moe::ExpertGrads> eg;
    for (int e = 0; e < plan.E; e++)  // zb1's B_input: none (the GEMMs skip a nullptr gradient)
      eg.push_back(defer ? moe::ExpertGrads{} : expert_grads(lp.experts[size_t(first + e)], plan.rows_of(e)));
    return eg;
  };
  const std::function<const S*(int)> wf = [&](int i) { return xw(i); };
  if (m.ep) {
    // The rows' gradient to the experts' ranks, the experts' backward there, the input gradient back.
    parallel::Comm& data = *m_.ep_data_;
    const int64_t R = m.ex.rows();
    Buffer dmine = act(R * C), dh = act(R * F), dinmine = act(R * C), staging = act(R * C);
    {
      const ops::Region region(c_, ops::kEpExchange);
      moe::to_experts(p(dmine), p(drows), m.ex, C, data, p(staging), ar_.mem());
    }
    drows.reset();
    const std::vector<moe::ExpertGrads> local = grads_of(m.ex.rank * m.ex.local, m.ex.experts);
    moe::experts_backward(p(dinmine), p(dh), local, p(dmine), p(m.rows), p(m.h_pre), p(m.h), m.ex.experts,
                          local_experts(lp, m.ex, wf), C, F, c_);
    {
      const ops::Region region(c_, ops::kEpExchange);
      moe::from_experts(p(din), p(dinmine), m.ex, C, data, p(staging), ar_.mem());
    }
    if (defer) {  // W reads the received rows' gradients here, with no exchange
      defer->d_out = std::move(dmine);
      defer->d_h = std::move(dh);
    }
  } else {
    Buffer dh = act(M * F);
    moe::experts_backward(p(din), p(dh), grads_of(0, m.plan), p(drows), p(m.rows),
                          p(m.h_pre), p(m.h), m.plan, expert_weights<S>(lp.experts, wf), C, F, c_);
    if (defer) {
      defer->d_out = std::move(drows);
      defer->d_h = std::move(dh);
    }
    drows.reset();
  }
  // The router: the gates' gradient plus the extra losses, weighted like the micro-batch's tokens.
  const double scale = double(dloss_) * N;
  // A micro-batch spread over G ranks (cp, or tp under sp) takes the balance term's f from the loads
  // summed over them; the op takes f_i = load_i / (N K) and P's 1/N with this rank's N, so the weight
  // carries N / N_total = 1 / G (d(N_total alpha A)/dp_{t,i} = alpha E f_i for every token, wherever it
  // lives).
  const bool over_group = bool(m.balance_load);
  const double aux_w = mc.balance == MoeBalance::aux ? scale * mc.aux_coef / (over_group ? token_group().size() : 1) : 0.0;
  const double z_w = scale * mc.z_coef;
  Buffer dlogits = f32(int64_t(N) * E), dx32 = f32(int64_t(N) * C);
  ops::moe_route_bwd(dlogits.f32(), dgate.f32(), m.probs.f32(), m.lse.f32(), pv.expert, m.gate.f32(),
                     over_group ? m.balance_load.i32() : pv.load, N, E, K, aux_w, z_w, c_);
  const float* x32 = nullptr;
  const float* wr = nullptr;
  Buffer w32;
  if constexpr (std::is_same_v<S, float>) {
    x32 = ln2;
    wr = w(lp.router_w);
  } else {
    x32 = m.x32.f32();
    w32 = f32(int64_t(E) * C);
    ops::convert(w32.f32(), w(lp.router_w), int64_t(E) * C, c_);
    wr = w32.f32();
  }
  moe::router_logits_backward(dx32.f32(), gw(lp.router_w), dlogits.f32(), x32, wr, N, C, E, c_);
  // The shared experts (each its own GEMMs over every token), into the fp32 sum.
  float* acc = dx32.f32();
  if (!lp.shared.empty()) {
    Buffer dpart = act(NC_), dfc = act(int64_t(N) * F), d32;
    for (size_t i = 0; i < lp.shared.size(); i++) {
      const MlpParams& sh = lp.shared[i];
      ops::matmul_bwd(p(dfc), gwout(sh.proj_w, int64_t(C) * F), gw(sh.proj_b), dx, p(m.shared_h[i]), w(sh.proj_w), N,
                      F, C, c_, p(m.shared_pre[i]));
      ops::matmul_bwd(p(dpart), gwout(sh.fc_w, int64_t(F) * C), gw(sh.fc_b), p(dfc), ln2, w(sh.fc_w), N, C, F, c_);
      if (defer) {
        defer->d_shared_fc.push_back(std::move(dfc));
        if (i + 1 < lp.shared.size()) dfc = act(int64_t(N) * F);
      }
      if constexpr (std::is_same_v<S, float>) {
        ops::add(acc, acc, p(dpart), NC_, c_);
      } else {
        if (!d32) d32 = f32(NC_);
        ops::convert(d32.f32(), p(dpart), NC_, c_);  // exact: the fp32 sum adds the S values
        ops::add(acc, acc, d32.f32(), NC_, c_);
      }
    }
    if (defer) {
      defer->d_x = act(NC_);
      ar_.mem().move(defer->d_x.data(), dx, size_t(NC_) * sizeof(S));
    }
  }
  ops::moe_permute_bwd(dln, p(din), acc, pv.row_of, N, K, C, c_);
  if (defer) {
    // W reads the experts' rows and hidden states, the router's input (ln2 or x32) and the shared
    // experts' hidden states: the rest goes now.
    defer->d_logits = std::move(dlogits);
    m.probs.reset(), m.lse.reset(), m.gate.reset(), m.plan_arrays.reset(), m.assignment_of.reset();
    m.balance_load.reset(), m.h_pre.reset(), m.out.reset();
    m.shared_pre.clear();
  }
}

// zb1's W of a mixture layer: the weight gradients moe_backward(defer) left out, each from the same
// operands by the same operation (experts, router, shared experts), so the same bits. Under expert
// parallelism this rank's experts take the rows they received in B_input: no communication.
template <class S>
void Pass<S>::moe_weight_backward(int l, const LayerActs& a, const MoeGrads& d) {
  const LayerParams& lp = m_.layers_[size_t(l)];
  const int N = Ns_, C = C_, F = 4 * C_, E = m_.cfg_.moe.experts;
  MT_CHECK(a.moe != nullptr && d.d_logits, "mixture layer %d: W without its B_input", l);
  const MoeActs& m = *a.moe;
  const int e0 = m.ep ? m.ex.rank * m.ex.local : 0, e1 = m.ep ? (m.ex.rank + 1) * m.ex.local : E;
  const moe::DispatchPlan& plan = m.ep ? m.ex.experts : m.plan;
  std::vector<moe::ExpertGrads> eg;
  for (int e = e0; e < e1; e++) eg.push_back(expert_grads(lp.experts[size_t(e)], plan.rows_of(e - e0)));
  moe::experts_weight_backward(eg, p(d.d_out), p(d.d_h), p(m.rows), p(m.h), plan, C, F, c_);
  const float* x32 = nullptr;
  if constexpr (std::is_same_v<S, float>) {
    x32 = p(a.ln2);
  } else {
    x32 = m.x32.f32();
  }
  moe::router_logits_backward(nullptr, g(lp.router_w), d.d_logits.f32(), x32, nullptr, N, C, E, c_);
  const S* none = nullptr;  // the weights: not read without an input gradient
  for (size_t i = 0; i < lp.shared.size(); i++) {
    const MlpParams& sh = lp.shared[i];
    ops::matmul_bwd(static_cast<S*>(nullptr), gout(sh.proj_w, int64_t(C) * F), g(sh.proj_b), p(d.d_x),
                    p(m.shared_h[i]), none, N, F, C, c_);
    ops::matmul_bwd(static_cast<S*>(nullptr), gout(sh.fc_w, int64_t(F) * C), g(sh.fc_b), p(d.d_shared_fc[i]),
                    p(a.ln2), none, N, C, F, c_);
  }
}

template <class S>
moe::ExpertGrads Pass<S>::expert_grads(const MlpParams& x, int64_t rows) const {
  if (rows == 0) return {};
  const int64_t n = int64_t(4) * C_ * C_;  // fc (F, C) and proj (C, F)
  return {xgout(x.fc_w, n), xgout(x.proj_w, n), xg(x.fc_b), xg(x.proj_b)};
}

template void Pass<float>::route_and_plan(int, const float*, MoeActs&);
template void Pass<bf16>::route_and_plan(int, const float*, MoeActs&);
template void Pass<f16>::route_and_plan(int, const float*, MoeActs&);
template void Pass<float>::moe_forward(int, float*, LayerActs&);
template void Pass<bf16>::moe_forward(int, bf16*, LayerActs&);
template void Pass<f16>::moe_forward(int, f16*, LayerActs&);
template void Pass<float>::moe_backward(int, const float*, float*, LayerActs&, MoeGrads*);
template void Pass<bf16>::moe_backward(int, const bf16*, bf16*, LayerActs&, MoeGrads*);
template void Pass<f16>::moe_backward(int, const f16*, f16*, LayerActs&, MoeGrads*);
template void Pass<float>::moe_weight_backward(int, const LayerActs&, const MoeGrads&);
template void Pass<bf16>::moe_weight_backward(int, const LayerActs&, const MoeGrads&);
template void Pass<f16>::moe_weight_backward(int, const LayerActs&, const MoeGrads&);

}  // namespace mt::model
