// One stage's forward and backward in the run's storage type S (the class behind GPT::stage_forward
// and GPT::stage_backward; model/gpt_forward.cpp has the layers and the classifier, model/gpt_stage.cpp
// the stage passes). Private to the model: included by those two files only.
#pragma once
#include <algorithm>
#include <memory>
#include <vector>

#include "model/gpt.h"
#include "moe/dispatch.h"
#include "moe/experts.h"
#include "moe/ep_exchange.h"
#include "moe/router.h"
#include "moe/token_group.h"
#include "runtime/check.h"

namespace mt::model {

// What a mixture layer's forward keeps for its backward (model/gpt_moe.cpp): the routing and the
// dispatch plan in the run's memory (probs, lse, gate; the plan's arrays), their host summary (the
// expert choices, loads, offsets and rows: routing.probs/lse/gate stay empty), the router's fp32
// input (a 16-bit run), the permuted rows, the experts' hidden states and outputs, and each shared
// expert's hidden states. M = kept assignments, A = N K assignments.
struct MoeActs {
  moe::Routing routing;
  moe::DispatchPlan plan;
  Buffer probs, lse, gate;                 // (N,E), (N), (A) fp32
  Buffer plan_arrays;                      // sums (E+1) f64, load (E), offset (E+1), expert (A), row_of (A) i32
  Buffer assignment_of;                    // (A) i32, the first M meaningful
  Buffer balance_load;                     // (E) i32, a micro-batch over ranks (cp, sp): the summed loads
  Buffer x32;                              // (N,C) fp32 router input (empty when S is float)
  Buffer rows, h_pre, h, out;              // (M,C), (M,4C), (M,4C), (M,C)
  // Expert parallelism: the exchange of this layer's rows, and the rows this rank's experts received
  // (R = ex.rows(); rows is then (R,C) and h_pre, h are (R,4C); out stays (M,C)).
  moe::ExpertExchange ex;
  bool ep = false;
  std::vector<Buffer> shared_pre, shared_h;  // (N,4C) each
};

// The activations of one layer that backward reads. att (materialized) or lse (flash) is only
// allocated when it is kept.
struct LayerActs {
  Buffer ln1, ln1_mean, ln1_rstd;  // (Ns,C) S, (Ns), (Ns) fp32
  Buffer qkv;                      // (N,3Cl), Cl = C/P
  Buffer att;                      // (B,NH/P,T,T) softmax probabilities (materialized)
  Buffer lse;                      // (B,NH/P,T) fp32 log-sum-exp per query (flash)
  Buffer atty;                     // (N,Cl) attention output before the projection
  Buffer res2;                     // (Ns,C) residual after attention
  Buffer ln2, ln2_mean, ln2_rstd;  // (Ns,C), (Ns), (Ns)
  Buffer fch, fch_gelu;            // (N,4C/P) each: before and after GELU (a dense MLP)
  std::shared_ptr<MoeActs> moe;    // a mixture layer's state (model/gpt_moe.cpp)
  bool allocated() const { return bool(ln1); }
};

// What zb1's B_input (the input gradient) leaves for W (the weight gradient) of one layer: the
// gradient of every weighted op's output, whose product with that op's saved input is the weight
// gradient. Row-parallel outputs (attention and MLP projections) as all N rows under sequence
// parallelism, as their GEMMs read them.
// A mixture layer (model/gpt_moe.cpp) keeps its own in `moe` instead of d_mlp_out and d_fc.
struct MoeGrads {
  Buffer d_out;  // (M,C) the experts' output gradient (c_proj's); under expert parallelism the (R,C) rows
                 // this rank's experts received in B_input, so that W needs no exchange
  Buffer d_h;    // like d_out, (.,4C): the experts' c_fc output gradient (GELU's derivative applied)
  Buffer d_logits;                  // (Ns,E) fp32 the router's output gradient
  Buffer d_x;                       // (Ns,C) the mixture's output gradient (the shared experts' c_proj)
  std::vector<Buffer> d_shared_fc;  // (Ns,4C) each shared expert's c_fc output gradient
};
struct LayerGrads {
  Buffer d_mlp_out;   // (N,C) the MLP projection's output gradient
  Buffer d_fc;        // (N,4C/P) c_fc's output gradient (GELU's derivative applied)
  MoeGrads moe;       // a mixture layer's
  Buffer d_ln2;       // (Ns,C) the second LayerNorm's output gradient
  Buffer d_attn_out;  // (N,C) the attention projection's output gradient
  Buffer d_qkv;       // (N,3Cl) c_attn's output gradient
  Buffer d_ln1;       // (Ns,C) the first LayerNorm's output gradient
};

// What a stage's forward leaves for its backward: the micro-batch (the caller's host arrays and their
// device copies), the residual stream at every layer boundary and what each layer keeps, and on the
// last stage the final LayerNorm's state, the gradient of its output and the per-token losses.
struct StageState final : StageContext {
  MicroBatch mb;
  int chunk = 0;
  int l0 = 0, l1 = 0;  // layers [l0, l1)
  bool first = false, last = false;  // stage 0 (embeds) / the last stage (loss)
  bool train = false, keep_layer = false, keep_att = false;
  bool emb_rows = false;  // the embeddings' gradient handed to the hooks as rows (data parallelism)
  float dloss = 0;
  std::vector<Buffer> uploads;  // the micro-batch's arrays in device memory (a GPU run)
  const int32_t *tokens = nullptr, *targets = nullptr, *positions = nullptr, *doc = nullptr;
  std::vector<int32_t> own_pos_host;  // tensor parallelism: the positions of this rank's rows
  const int32_t* own_pos = nullptr;
  std::vector<Buffer> xs;       // xs[i]: the input of layer l0 + i; xs[l1 - l0]: the stage's output
  std::vector<LayerActs> acts;  // per layer, when kept (recompute != full)
  Buffer lnf, lnf_mean, lnf_rstd, dlnf, losses;  // last stage
  double loss_sum = 0;
  bool loss_done = false;
  bool keep_losses = false;  // training: backward leaves `losses` for GPT::take_stage_losses
  Buffer dx;  // after backward: the gradient of the stage's input
  // zb1: after B_input, per layer what W needs (the activations stay in xs and acts until then).
  std::vector<LayerGrads> deferred;
  bool weights_pending = false;
};

inline constexpr MemCategory kAct = MemCategory::activations;

template <class S>
class Pass {
 public:
  Pass(GPT& m, const MicroBatch& mb)
      : m_(m), s_(m.store_), xs_(m.xstore_), ar_(*m.arena_), c_(m.ctx_), mb_(mb), tp_(m.tp_), B_(mb.B), T_(mb.T), C_(m.cfg_.n_embd),
        NH_(m.cfg_.n_head), N_(mb.B * mb.T), P_(tp_.size()), Ns_(int(tp_.own_rows(N_))), Cl_(C_ / P_),
        NHl_(NH_ / P_), NC_(int64_t(Ns_) * C_), flash_(m.attention_ == Attention::flash), cp_(m.cp_) {
    MT_CHECK(flash_ || !cp_.active(), "context parallelism needs attention=flash (ring attention)");
  }

  // Forward of the stage `st` describes (set up by GPT::forward_chunk): from `input` (stage 0: the
  // tokens) to its output, or on the last stage to the losses (train: and the gradient of lnf).
  // last_logits mode stops after the final LayerNorm and writes the last position's logits.
  void forward(StageState& st, Buffer input, GPT::Mode mode, float* last_logits);
  // Backward of a training forward: `dy` the gradient of the stage's output (empty on the last stage);
  // leaves the gradient of its input in st.dx (stage 0: none) and, on the last stage, the loss sum.
  // split (zb1's B_input): the layers' weight gradients are left for weight_backward; the embedding's
  // and the final LayerNorm's are still computed here (they are small, and on the first and last
  // stage only).
  void backward(StageState& st, Buffer dy, bool split = false);
  // zb1's W: every layer's weight gradients from what backward(split) kept; frees the stage's state.
  void weight_backward(StageState& st);

 private:
  // Buffers that live for one pass (forward or backward) of one stage.
  struct Workspace {
    Buffer att;          // (B,NH,T,T) probabilities when a layer did not keep its own
    Buffer att_scratch;  // (B,NH,T,T) fp32 attention backward workspace (flash: (B,NH,T))
    Buffer dln, xnext;   // (Ns,C)
    Buffer datty;        // (N,Cl)
    Buffer dqkv;         // (N,3Cl)
    Buffer dfc;          // (N,4C/P)
    // Sequence parallelism, (N,C) each: partial products before their reduce-scatter, a LayerNorm
    // output gathered for a column-parallel GEMM, and the gathered gradient of the residual stream.
    Buffer partial, ln_all, dx_all;
    Buffer ln_scratch;  // (2C) fp32: the LayerNorm weight gradients zb1's B_input makes and drops
  };

  // Every activation buffer is written before it is read, so none is zero-filled (on the CPU they
  // start as NaN, which any read-before-write would spread into the loss).
  Buffer act(int64_t elems) { return ar_.alloc_uninitialized(kAct, size_t(elems) * sizeof(S)); }
  Buffer f32(int64_t elems) { return ar_.alloc_uninitialized(kAct, size_t(elems) * sizeof(float)); }
  static S* p(const Buffer& b) { return static_cast<S*>(b.data()); }
  int64_t att_elems() const { return int64_t(B_) * NHl_ * T_ * T_; }
  int64_t lse_elems() const { return int64_t(B_) * NHl_ * T_; }
  int64_t all_rows_elems() const { return int64_t(N_) * C_; }  // (N,C)
  // Sequence parallelism: this rank's rows `own` gathered into `all` (allocated on first use); without
  // it `own` already holds every row.
  const S* gathered(Buffer& all, const S* own) {
    if (!tp_.splits_sequence()) return own;
    if (!all) all = act(all_rows_elems());
    tp_.gather(p(all), own, Ns_, C_);
    return p(all);
  }
  // Where a row-parallel product goes before it is summed over tp into `own` (Ns,C): the (N,C)
  // partial buffer under sequence parallelism, else `own` itself (summed in place).
  S* partial_out(Workspace& ws, S* own) { return tp_.splits_sequence() ? p(ws.partial) : own; }
  void sum_partial(S* own, Workspace& ws) {
    if (tp_.active()) tp_.sum_scatter(own, partial_out(ws, own), Ns_, C_);
  }
  // The backward of a column-parallel GEMM (c_attn, c_fc) whose input is this rank's rows `inp_own`
  // of a LayerNorm output: dinp_own = this rank's rows of the input gradient, summed over tp.
  // dw == nullptr: the input gradient only; dinp_own == nullptr: the weight gradients only.
  void column_parallel_bwd(S* dinp_own, ops::GradOut dw, float* db, const S* dout, const S* inp_own, const S* w,
                           int OC, Workspace& ws);
  // A row-parallel bias is added by one rank, so that the sum over tp holds it once.
  const S* bias_once(int i) const { return tp_.rank() == 0 ? w(i) : nullptr; }
  // dense_mlp: the layer's MLP is dense (a mixture layer keeps MoeActs instead of fch, fch_gelu).
  void alloc_layer(LayerActs& a, bool with_att, bool dense_mlp = true);

  // The weight entry i as the ops read it, in S.
  const S* w(int i) const {
    const ParamEntry& e = s_.entry(i);
    MT_CHECK(m_.acquired_[size_t(e.unit)], "weight '%s' read outside an acquire of its unit", e.name.c_str());
    return s_.compute_as<S>(i);
  }
  // Unit u's parameters (and gradient buffer) about to be used: the hooks materialise them.
  void acquire(int u, bool grads) { m_.acquire(u, grads); }
  float* g(int i) const { return s_.grad(i); }
  // Entry i's gradient for a GEMM that sets all n of its elements: written over at the step's first
  // contribution, added to after (ParamStore::grad_for_write).
  ops::GradOut gout(int i, int64_t n) const { return grad_out(s_, i, n); }
  // The same for a routed expert's entry i (in the expert store when expert parallelism holds the
  // experts apart, GPT::expert_store).
  const S* xw(int i) const {
    const ParamEntry& e = xs_.entry(i);
    MT_CHECK(m_.expert_acquired(e.unit), "expert weight '%s' read outside an acquire of its unit", e.name.c_str());
    return xs_.compute_as<S>(i);
  }
  float* xg(int i) const { return xs_.grad(i); }
  ops::GradOut xgout(int i, int64_t n) const { return grad_out(xs_, i, n); }
  static ops::GradOut grad_out(ParamStore& s, int i, int64_t n) {
    bool assign = false;
    float* p = s.grad_for_write(i, n, &assign);
    return {p, assign};
  }
  // A routed expert's gradients for a backward over `rows` of its rows: none without rows (the
  // backward skips it, and an entry it does not write must not be claimed for assignment).
  moe::ExpertGrads expert_grads(const MlpParams& x, int64_t rows) const;

  // A mixture layer's MLP (model/gpt_moe.cpp): x_next = res2 + shared experts + the gate-weighted
  // routed experts of ln2; its backward leaves dL/d ln2 in dln and adds the weights' gradients,
  // the router's including the load-balancing and z-losses.
  void moe_forward(int l, S* x_next, LayerActs& a);
  // The router's top-k on logits (N,E) and the dispatch plan into m, on the run's device, with the
  // plan's summary copied to the host once (m.routing's choices and loads, m.plan's offsets and rows).
  void route_and_plan(int l, const float* logits, MoeActs& m);
  // The ranks holding this micro-batch's rows (moe/token_group.h): cp, and tp under sp.
  moe::TokenGroup token_group() const;
  void balance_over_group(MoeActs& m, const moe::TokenGroup& group, const double* sums, const int32_t* load);
  // dx: the mixture's output gradient; dln (Ns,C) assigned dL/d ln2. defer != nullptr (zb1's B_input):
  // no weight gradient, the weighted ops' output gradients kept in it for moe_weight_backward, which
  // makes the weight gradients from them with the same operations (the unsplit backward's bits).
  void moe_backward(int l, const S* dx, S* dln, LayerActs& a, MoeGrads* defer = nullptr);
  void moe_weight_backward(int l, const LayerActs& a, const MoeGrads& d);
  void layer_forward(int l, const S* x, S* x_next, LayerActs& a, Workspace& ws, const int32_t* doc);
  // defer != nullptr (zb1's B_input): the input gradient only, the op outputs' gradients kept in it.
  void layer_backward(int l, S* dx, const S* x, LayerActs& a, Workspace& ws, const int32_t* doc,
                      LayerGrads* defer = nullptr);
  void layer_weight_backward(int l, const S* x, const LayerActs& a, const LayerGrads& d, Workspace& ws);
  // Allocates the pass's shared buffers: the sequence-parallel ones, the shared attention state of the
  // layers that do not keep theirs, the layer scratch of full recompute.
  void alloc_workspace(const StageState& st, Workspace& ws, LayerActs& scratch);
  void device_inputs(StageState& st);
  void embed(StageState& st, S* x0, Workspace& ws);
  void embed_backward(StageState& st, Buffer& dx, Workspace& ws);
  void head_forward(StageState& st, Workspace& ws, GPT::Mode mode, float* last_logits_out);
  // Fills `losses` (N, fp32) with the per-token losses and, if grads, dlnf and wte's gradient.
  // lnf: all N rows; dlnf: (N,C), under tensor parallelism this rank's partial sum.
  void classifier(float* losses, const S* lnf, S* dlnf, const int32_t* targets, float dloss, bool grads);
  double sum_losses(const Buffer& losses);
  void last_logits(const S* lnf, float* out);

  GPT& m_;
  ParamStore& s_;
  ParamStore& xs_;  // the routed experts' store (s_ unless held apart)
  Arena& ar_;
  const ops::Ctx& c_;
  const MicroBatch& mb_;
  const parallel::TensorParallel& tp_;
  // N rows of the micro-batch; P tp ranks; Ns rows of the residual stream held here (N/P under
  // sequence parallelism); Cl = C/P attention width and NHl = NH/P heads held here.
  const int B_, T_, C_, NH_, N_, P_, Ns_, Cl_, NHl_;
  const int64_t NC_;  // Ns x C: the residual stream held here
  const bool flash_;
  // Set by backward: a layer forward run there (full recompute) leaves the routing statistics alone.
  bool in_backward_ = false;
  float dloss_ = 0;  // the pass's loss weight (the load-balancing and z-losses are weighted alike)
  const parallel::RingAttention& cp_;  // context parallelism: attention over the cp ring
};


}  // namespace mt::model
