// A mixture-of-experts MLP inside a GPT layer, in the run's storage type S (moe/ has the pieces):
//
//   forward   logits = ln2 W_r^T in fp32 -> routing (top-k, gates, the bias chooses) -> dispatch plan
//             (capacity, drops) -> rows = ln2 permuted by expert -> each expert's MLP on its rows ->
//             x_next = res2 + sum of the shared experts' MLPs + the gate-weighted combine;
//   backward  the combine's backward gives the rows' and the gates' gradients; the experts' backward
//             the permuted input's; the router's backward the logits' (gates, plus the load-balancing
//             loss alpha E sum f_i P_i when balance = aux, plus the z-loss), and from them W_r's and
//             the router input's; dL/d ln2 sums the permuted rows back, the router's and the shared
//             experts' parts in fp32, rounded once.
//
// The two extra losses enter the objective as N x (alpha A + beta Z) per micro-batch of N tokens,
// weighted by the pass's dloss like the token losses: their share of the mean loss is that of the
// micro-batch's tokens. The CPU backend only (TrainOptions::validate refuses the others).
//
// Tensor parallelism: the mixture is not split. Each tp rank runs it whole on the rows it holds (its
// 1/tp of them under sequence parallelism, whose weight gradients are then partial sums over tp,
// like a LayerNorm's; all of them, computed alike on every tp rank, without), so the balance term A
// is taken over those rows.
//
// Expert parallelism (GPT::set_expert_parallel, moe/ep_exchange.h): routing, the plan (capacity, drops)
// and the combine stay with the tokens' rank; only the permuted rows travel, to the ranks holding their
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
}  // namespace

template <class S>
void Pass<S>::moe_forward(int l, S* x_next, LayerActs& a) {
  MT_CHECK(c_.device == Device::cpu, "mixture-of-experts layers run on the CPU backend");
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
  const bool bias = mc.balance == MoeBalance::bias;
  m.routing = moe::route(logits.f32(), bias ? m_.moe_bias_[size_t(l)].data() : nullptr, N, E, K);
  m.plan = moe::plan_dispatch(m.routing.expert.data(), N, K, E, moe::expert_capacity(mc.capacity, N, K, E));
  const int64_t M = m.plan.rows();
  m.rows = act(M * C);
  m.out = act(M * C);
  moe::permute(p(m.rows), ln2, m.plan, C);
  const std::function<const S*(int)> wf = [&](int i) { return xw(i); };
  MT_CHECK(!m_.experts_.apart() || (m_.ep_ != nullptr && m_.ep_->size() == m_.experts_.ranks),
           "mixture layer %d: experts placed over %d ranks, but the ep group has %d", l, m_.experts_.ranks,
           m_.ep_ ? m_.ep_->size() : 1);
  if (m_.ep_ != nullptr && m_.ep_->size() > 1) {
    // Expert parallelism: the rows to their experts' ranks, this rank's experts, the outputs back.
    parallel::Comm& ep = *m_.ep_;
    m.ep = true;
    m.ex = moe::exchange_counts(m.plan, ep);
    const int64_t R = m.ex.rows();
    Buffer mine = act(R * C), out = act(R * C);
    moe::to_experts(p(mine), p(m.rows), m.ex, C, ep);
    m.rows = std::move(mine);
    m.h_pre = act(R * F);
    m.h = act(R * F);
    moe::experts_forward(p(out), p(m.h_pre), p(m.h), p(m.rows), m.ex.experts, local_experts(lp, m.ex, wf), C, F, c_);
    moe::from_experts(p(m.out), p(out), m.ex, C, ep);
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
  moe::combine(x_next, p(m.out), m.routing.gate.data(), base, m.plan, C);
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
void Pass<S>::moe_backward(int l, const S* dx, LayerActs& a, Workspace& ws) {
  const LayerParams& lp = m_.layers_[size_t(l)];
  const MoeConfig& mc = m_.cfg_.moe;
  const int N = Ns_, C = C_, F = 4 * C_, E = mc.experts, K = mc.top_k;  // this rank's rows
  MT_CHECK(a.moe != nullptr, "mixture layer %d: backward without its forward state", l);
  MoeActs& m = *a.moe;
  const int64_t M = m.plan.rows();
  const S* ln2 = p(a.ln2);
  // Combine, then the experts.
  Buffer drows = act(M * C), dgate = f32(int64_t(N) * K);
  moe::combine_backward(p(drows), dgate.f32(), dx, p(m.out), m.routing.gate.data(), m.plan, C);
  Buffer din = act(M * C);
  auto grads_of = [&](std::vector<MlpParams>::const_iterator b, std::vector<MlpParams>::const_iterator e) {
    std::vector<moe::ExpertGrads> eg;
    for (; b != e; ++b) eg.push_back({xg(b->fc_w), xg(b->fc_b), xg(b->proj_w), xg(b->proj_b)});
    return eg;
  };
  const std::function<const S*(int)> wf = [&](int i) { return xw(i); };
  if (m.ep) {
    // The rows' gradient to the experts' ranks, the experts' backward there, the input gradient back.
    parallel::Comm& ep = *m_.ep_;
    const int64_t R = m.ex.rows();
    Buffer dmine = act(R * C), dh = act(R * F), dinmine = act(R * C);
    moe::to_experts(p(dmine), p(drows), m.ex, C, ep);
    drows.reset();
    const std::vector<moe::ExpertGrads> local =
        grads_of(lp.experts.begin() + m.ex.rank * m.ex.local, lp.experts.begin() + (m.ex.rank + 1) * m.ex.local);
    moe::experts_backward(p(dinmine), p(dh), local, p(dmine), p(m.rows), p(m.h_pre), p(m.h), m.ex.experts,
                          local_experts(lp, m.ex, wf), C, F, c_);
    moe::from_experts(p(din), p(dinmine), m.ex, C, ep);
  } else {
    Buffer dh = act(M * F);
    moe::experts_backward(p(din), p(dh), grads_of(lp.experts.begin(), lp.experts.end()), p(drows), p(m.rows), p(m.h_pre), p(m.h), m.plan,
                          expert_weights<S>(lp.experts, wf), C, F, c_);
    drows.reset();
  }
  // The router: the gates' gradient plus the extra losses, weighted like the micro-batch's tokens.
  const double scale = double(dloss_) * N;
  const double aux_w = mc.balance == MoeBalance::aux ? scale * mc.aux_coef : 0.0, z_w = scale * mc.z_coef;
  Buffer dlogits = f32(int64_t(N) * E), dx32 = f32(int64_t(N) * C);
  moe::route_backward(dlogits.f32(), dgate.f32(), m.routing, aux_w, z_w);
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
  moe::router_logits_backward(dx32.f32(), g(lp.router_w), dlogits.f32(), x32, wr, N, C, E, c_);
  // The shared experts (each its own GEMMs over every token), into the fp32 sum.
  float* acc = dx32.f32();
  if (!lp.shared.empty()) {
    Buffer dpart = act(NC_), dfc = act(int64_t(N) * F);
    for (size_t i = 0; i < lp.shared.size(); i++) {
      const MlpParams& sh = lp.shared[i];
      ops::matmul_bwd(p(dfc), g(sh.proj_w), g(sh.proj_b), dx, p(m.shared_h[i]), w(sh.proj_w), N, F, C, c_,
                      p(m.shared_pre[i]));
      ops::matmul_bwd(p(dpart), g(sh.fc_w), g(sh.fc_b), p(dfc), ln2, w(sh.fc_w), N, C, F, c_);
      const S* d = p(dpart);
      for (int64_t k = 0; k < NC_; k++) acc[k] += load(d[k]);
    }
  }
  moe::permute_backward(p(ws.dln), p(din), acc, m.plan, C);
}

template void Pass<float>::moe_forward(int, float*, LayerActs&);
template void Pass<bf16>::moe_forward(int, bf16*, LayerActs&);
template void Pass<f16>::moe_forward(int, f16*, LayerActs&);
template void Pass<float>::moe_backward(int, const float*, LayerActs&, Workspace&);
template void Pass<bf16>::moe_backward(int, const bf16*, LayerActs&, Workspace&);
template void Pass<f16>::moe_backward(int, const f16*, LayerActs&, Workspace&);

}  // namespace mt::model
