// GPT stages: the forward and backward of one chunk of layers (with the embedding on stage 0, the final
// LayerNorm and the fused classifier on the last stage), and the whole-model calls composed of them.
//
// Units are acquired and released within one stage call, so that several micro-batches can be in
// flight on a stage (a pipeline schedule runs F of micro-batch k + 1 before B of k): each call
// brackets its own use of a unit, and a ZeRO-3 engine gathers it again for backward.
#include <chrono>
#include <type_traits>
#include <vector>

#include "model/gpt_pass.h"
#include "runtime/check.h"

namespace mt::model {

namespace {
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }
}  // namespace

template <class S>
void Pass<S>::alloc_workspace(const StageState& st, Workspace& ws, LayerActs& scratch) {
  if (tp_.splits_sequence()) {
    ws.partial = act(all_rows_elems());
    ws.ln_all = act(all_rows_elems());
  }
  // A layer that does not keep its attention state borrows one shared buffer for it.
  if (!st.keep_att) ws.att = flash_ ? f32(lse_elems()) : act(att_elems());
  if (!st.keep_layer) alloc_layer(scratch, false);
}

// The ops read the micro-batch where the arena's memory is: on a device, upload the host arrays
// (check_batch has validated them on the host). On the CPU these are the caller's arrays.
template <class S>
void Pass<S>::device_inputs(StageState& st) {
  auto on_device = [&](const int32_t* host, int64_t n) -> const int32_t* {
    if (!host || ar_.device() == Device::cpu) return host;
    st.uploads.push_back(ar_.alloc(kAct, size_t(n) * 4));
    ar_.upload(st.uploads.back().data(), host, size_t(n) * 4);
    return st.uploads.back().i32();
  };
  st.tokens = on_device(mb_.tokens, N_);
  st.targets = on_device(mb_.targets, N_);
  st.positions = on_device(mb_.positions, N_);
  st.doc = on_device(mb_.doc_ids, N_);
  // Tensor parallelism adds the position embedding to this rank's own rows only: their positions.
  if (tp_.active() && st.first) {
    const int64_t r0 = tp_.first_row(N_);
    for (int64_t i = r0; i < r0 + Ns_; i++)
      st.own_pos_host.push_back(mb_.positions ? mb_.positions[i] : int32_t(i % T_));
    st.own_pos = on_device(st.own_pos_host.data(), Ns_);
  }
}

template <class S>
void Pass<S>::embed(StageState& st, S* x0, Workspace& ws) {
  const int emb = m_.emb_unit_, pos = m_.pos_unit_;
  acquire(emb, false);
  if (pos != emb) acquire(pos, false);
  if (!tp_.active()) {
    ops::encoder_fwd(x0, st.tokens, st.positions, w(m_.wte_), w(m_.wpe_), B_, T_, C_, c_);
  } else {
    // This rank's vocabulary rows (other ids give zero rows), summed over tp, plus the positions.
    const int Vl = m_.cfg_.padded_vocab() / P_;
    ops::embedding_fwd(partial_out(ws, x0), st.tokens, w(m_.wte_), tp_.rank() * Vl, Vl, N_, C_, c_);
    sum_partial(x0, ws);
    Buffer pe = act(NC_);
    ops::embedding_fwd(p(pe), st.own_pos, w(m_.wpe_), 0, m_.cfg_.block_size, Ns_, C_, c_);
    ops::add(x0, x0, p(pe), NC_, c_);
  }
  if (pos != emb) m_.release(pos);
  m_.release(emb);
}

// Final LayerNorm and the classifier (over all N rows: gathered under sequence parallelism). In
// training the classifier's fused backward leaves the gradient of the LayerNorm's output in st.dlnf
// and adds wte's gradient.
template <class S>
void Pass<S>::head_forward(StageState& st, Workspace& ws, GPT::Mode mode, float* last_logits_out) {
  const int emb = m_.emb_unit_, fin = m_.final_unit_;
  const S* xL = p(st.xs.back());
  st.lnf = act(NC_);
  st.lnf_mean = f32(Ns_);
  st.lnf_rstd = f32(Ns_);
  acquire(fin, false);
  ops::layernorm_fwd(p(st.lnf), st.lnf_mean.f32(), st.lnf_rstd.f32(), xL, w(m_.lnf_w_), w(m_.lnf_b_), Ns_, C_, c_);
  m_.release(fin);
  if (mode == GPT::Mode::last_logits) {
    acquire(emb, false);
    last_logits(p(st.lnf), last_logits_out);
    m_.release(emb);
    return;
  }
  const S* lnf_rows = gathered(ws.ln_all, p(st.lnf));
  if (st.train) st.dlnf = act(NC_);
  acquire(emb, st.train);  // the tied unembedding
  st.losses = f32(N_);
  classifier(st.losses.f32(), lnf_rows, st.train ? partial_out(ws, p(st.dlnf)) : nullptr, st.targets, st.dloss,
             st.train);
  if (st.train) sum_partial(p(st.dlnf), ws);
  m_.release(emb);
  // Data parallelism may take the embeddings' remaining (sparse) gradient as rows, so that the large
  // dense part can be reduced from here on, overlapping the whole backward. A last stage without the
  // embedding (pipeline parallelism) has its copy of wte's gradient complete here.
  if (st.emb_rows || (st.train && !m_.plan_.first)) m_.grads_ready(emb);
}

template <class S>
void Pass<S>::forward(StageState& st, Buffer input, GPT::Mode mode, float* last_logits_out) {
  const auto t_start = clock_type::now();
  const int n = st.l1 - st.l0;
  dloss_ = st.dloss;
  MT_CHECK(mode != GPT::Mode::last_logits || (!tp_.active() && !cp_.active()), "sampling runs on one rank (tp = cp = 1)");
  if (st.train && m_.phase_hook_) m_.phase_hook_("forward");
  device_inputs(st);
  st.xs.resize(size_t(n) + 1);  // residual stream: xs[i] is layer l0 + i's input
  if (st.keep_layer) st.acts.resize(size_t(n));
  LayerActs scratch;
  Workspace ws;
  alloc_workspace(st, ws, scratch);
  auto borrow_att = [&](LayerActs& a) { std::swap(flash_ ? a.lse : a.att, ws.att); };

  // Forward. In eval mode only the current residual is kept (xs[i] freed as soon as it is consumed).
  if (st.first) {
    st.xs[0] = act(NC_);
    embed(st, p(st.xs[0]), ws);
  } else {
    MT_CHECK(input && input.bytes() == size_t(NC_) * sizeof(S), "stage %d: its input activation is %zu bytes, not %lld",
             st.chunk, input.bytes(), (long long)(NC_ * int64_t(sizeof(S))));
    st.xs[0] = std::move(input);
  }
  for (int i = 0; i < n; i++) {
    const int l = st.l0 + i;
    LayerActs& a = st.keep_layer ? st.acts[size_t(i)] : scratch;
    if (st.keep_layer) alloc_layer(a, st.keep_att, !m_.cfg_.is_moe_layer(l));
    st.xs[size_t(i) + 1] = act(NC_);
    if (!st.keep_att) borrow_att(a);
    m_.acquire_layer(l, false);
    layer_forward(l, p(st.xs[size_t(i)]), p(st.xs[size_t(i) + 1]), a, ws, st.doc);
    m_.release_layer(l);
    if (!st.keep_att) borrow_att(a);
    if (!st.train) st.xs[size_t(i)].reset();
  }
  if (st.last) head_forward(st, ws, mode, last_logits_out);
  m_.times_.forward += since(t_start);
  if (st.last && !st.train && mode == GPT::Mode::eval) {
    st.loss_sum = sum_losses(st.losses);
    st.loss_done = true;
  }
}

template <class S>
void Pass<S>::embed_backward(StageState& st, Buffer& dx, Workspace& ws) {
  const int emb = m_.emb_unit_, pos = m_.pos_unit_;
  if (st.emb_rows) {
    // d wte[tokens[i]] += dx[i] and d wpe[positions[i]] += dx[i]: the encoder's backward, as rows.
    // Host rows: data parallelism over several ranks runs on the CPU backend only.
    std::vector<int32_t> pos_rows(mb_.positions ? mb_.positions : nullptr,
                                  mb_.positions ? mb_.positions + N_ : nullptr);
    if (!mb_.positions) {
      pos_rows.resize(size_t(N_));
      for (int i = 0; i < N_; i++) pos_rows[size_t(i)] = i % T_;
    }
    Buffer dx32;
    const float* rows = nullptr;
    if constexpr (std::is_same_v<S, float>) {
      rows = dx.f32();
    } else {
      dx32 = f32(NC_);
      ops::convert(dx32.f32(), p(dx), NC_, c_);
      rows = dx32.f32();
    }
    m_.hooks_->add_row_grads(emb, {UnitHooks::RowGrads{m_.wte_, mb_.tokens, rows, N_, C_},
                                   UnitHooks::RowGrads{m_.wpe_, pos_rows.data(), rows, N_, C_}});
    return;
  }
  acquire(emb, true);
  if (pos != emb) acquire(pos, true);
  if (!tp_.active()) {
    ops::encoder_bwd(g(m_.wte_), g(m_.wpe_), p(dx), st.tokens, st.positions, B_, T_, C_, c_);
  } else {
    const int Vl = m_.cfg_.padded_vocab() / P_;
    ops::embedding_bwd(g(m_.wte_), gathered(ws.dx_all, p(dx)), st.tokens, tp_.rank() * Vl, Vl, N_, C_, c_);
    ops::embedding_bwd(g(m_.wpe_), p(dx), st.own_pos, 0, m_.cfg_.block_size, Ns_, C_, c_);
  }
  if (pos != emb) {
    m_.release(pos);
    m_.grads_ready(pos);  // units from the top of the flat buffers down
  }
  m_.release(emb);
  m_.grads_ready(emb);
}

template <class S>
void Pass<S>::backward(StageState& st, Buffer dy, bool split) {
  const auto t_start = clock_type::now();
  const int n = st.l1 - st.l0, fin = m_.final_unit_;
  MT_CHECK(st.train, "stage backward after an eval forward");
  in_backward_ = true;
  dloss_ = st.dloss;
  if (m_.phase_hook_) m_.phase_hook_("backward");
  LayerActs scratch;
  Workspace ws;
  alloc_workspace(st, ws, scratch);
  auto borrow_att = [&](LayerActs& a) { std::swap(flash_ ? a.lse : a.att, ws.att); };
  Buffer dx;
  if (st.last) {
    dx = act(NC_);
    acquire(fin, true);
    ops::layernorm_bwd(p(dx), g(m_.lnf_w_), g(m_.lnf_b_), p(st.dlnf), p(st.xs.back()), w(m_.lnf_w_),
                       st.lnf_mean.f32(), st.lnf_rstd.f32(), Ns_, C_, false, c_);
    m_.release(fin);
    m_.grads_ready(fin);
    st.lnf.reset();
    st.dlnf.reset();
  } else {
    MT_CHECK(dy && dy.bytes() == size_t(NC_) * sizeof(S), "stage %d: the gradient of its output is %zu bytes, not %lld",
             st.chunk, dy.bytes(), (long long)(NC_ * int64_t(sizeof(S))));
    dx = std::move(dy);  // updated in place, layer by layer, into the gradient of the stage's input
  }
  const int64_t NCl = int64_t(N_) * Cl_;
  // The materialised backward's fp32 (B, NH, T, T) workspace is the CUDA kernels' (dP, then dS, of
  // every pair at once); the CPU's keeps dS one block of query rows at a time and takes none.
  ws.att_scratch = f32(flash_ ? lse_elems() : ar_.device() == Device::cpu ? 0 : att_elems());
  ws.dln = act(NC_);
  ws.datty = act(NCl);
  if (!split) {  // under split each layer's own LayerGrads take these gradients
    ws.dqkv = act(3 * NCl);
    ws.dfc = act(4 * NCl);
  }
  if (!st.keep_layer) ws.xnext = act(NC_);
  if (split) {
    // W reads each layer's input (xs), activations and the gradients kept here; under full
    // recompute the activations rebuilt here are kept for it too.
    ws.ln_scratch = f32(2 * int64_t(C_));
    st.deferred.resize(size_t(n));
    if (st.acts.empty()) st.acts.resize(size_t(n));
  }
  for (int i = n - 1; i >= 0; i--) {
    const int l = st.l0 + i;
    if (!split || i + 1 == n) st.xs[size_t(i) + 1].reset();
    LayerActs& a = st.keep_layer || split ? st.acts[size_t(i)] : scratch;
    LayerGrads* defer = split ? &st.deferred[size_t(i)] : nullptr;
    if (defer) {
      if (!m_.cfg_.is_moe_layer(l)) {  // a mixture layer keeps its own (MoeGrads)
        defer->d_mlp_out = act(all_rows_elems());
        defer->d_fc = act(4 * NCl);
      }
      defer->d_ln2 = act(NC_);
      defer->d_attn_out = act(all_rows_elems());
      defer->d_qkv = act(3 * NCl);
      defer->d_ln1 = act(NC_);
    }
    m_.acquire_layer(l, !split);
    if (st.keep_layer) {
      layer_backward(l, p(dx), p(st.xs[size_t(i)]), a, ws, st.doc, defer);
    } else {  // full recompute: re-run this layer's forward from its saved input, then its backward
      if (split) alloc_layer(a, false, !m_.cfg_.is_moe_layer(l));
      borrow_att(a);
      layer_forward(l, p(st.xs[size_t(i)]), p(ws.xnext), a, ws, st.doc);
      layer_backward(l, p(dx), p(st.xs[size_t(i)]), a, ws, st.doc, defer);
      borrow_att(a);
    }
    m_.release_layer(l);
    if (split) {  // what W does not read
      a.qkv.reset();
      a.att.reset();
      a.lse.reset();
      a.fch.reset();
    } else {
      m_.layer_grads_ready(l);
      if (st.keep_layer) a = LayerActs();
    }
  }
  st.weights_pending = split;
  if (!split) st.xs[0].reset();
  if (st.first) embed_backward(st, dx, ws);
  else st.dx = std::move(dx);
  if (st.last && !st.keep_losses) {
    st.loss_sum = sum_losses(st.losses);  // waits for the whole backward on a device
    st.loss_done = true;
    st.losses.reset();
  }
  m_.times_.backward += since(t_start);
}

template <class S>
void Pass<S>::weight_backward(StageState& st) {
  const auto t_start = clock_type::now();
  MT_CHECK(st.weights_pending, "stage %d: W without its B_input, or twice", st.chunk);
  if (m_.phase_hook_) m_.phase_hook_("backward");
  Workspace ws;
  if (tp_.splits_sequence()) ws.ln_all = act(all_rows_elems());
  ws.dln = act(NC_);  // the LayerNorm backward's input gradient, unused
  for (int i = st.l1 - st.l0 - 1; i >= 0; i--) {  // top down, as the unsplit backward hands units over
    const int l = st.l0 + i;
    m_.acquire_layer(l, true);
    layer_weight_backward(l, p(st.xs[size_t(i)]), st.acts[size_t(i)], st.deferred[size_t(i)], ws);
    m_.release_layer(l);
    m_.layer_grads_ready(l);
    st.acts[size_t(i)] = LayerActs();
    st.deferred[size_t(i)] = LayerGrads();
    st.xs[size_t(i)].reset();
  }
  st.weights_pending = false;
  m_.times_.backward += since(t_start);
}

#define MT_PASS_STAGE_MEMBERS(S)                                          \
  template void Pass<S>::forward(StageState&, Buffer, GPT::Mode, float*); \
  template void Pass<S>::backward(StageState&, Buffer, bool);             \
  template void Pass<S>::weight_backward(StageState&);
MT_PASS_STAGE_MEMBERS(float)
MT_PASS_STAGE_MEMBERS(bf16)
MT_PASS_STAGE_MEMBERS(f16)
#undef MT_PASS_STAGE_MEMBERS

// ---- GPT's stage interface and the whole-model calls ----

void GPT::check_ready() const {
  MT_CHECK(arena_ != nullptr, "GPT::run without an arena (call set_arena)");
  MT_CHECK(store_.finalized(), "GPT::run before the ParamStore is finalized");
}

int64_t GPT::stage_activation_elems(const MicroBatch& mb) const {
  return tp_.own_rows(int64_t(mb.B) * mb.T) * cfg_.n_embd;
}

std::unique_ptr<StageContext> GPT::forward_chunk(int chunk, const MicroBatch& mb, Buffer input, float dloss, Mode mode,
                                                 float* last_logits) {
  MT_CHECK(chunk >= 0 && chunk < int(plan_.chunks.size()), "stage: chunk %d of %zu", chunk, plan_.chunks.size());
  if (acquired_.size() != size_t(store_.num_units())) acquired_.assign(size_t(store_.num_units()), 0);
  if (xacquired_.size() != size_t(xstore_.num_units())) xacquired_.assign(size_t(xstore_.num_units()), 0);
  auto st = std::make_unique<StageState>();
  st->mb = mb;
  st->chunk = chunk;
  st->l0 = plan_.chunks[size_t(chunk)].begin;
  st->l1 = plan_.chunks[size_t(chunk)].end;
  st->first = plan_.first && chunk == 0;
  st->last = plan_.last && chunk + 1 == int(plan_.chunks.size());
  st->train = mode == Mode::train;
  st->dloss = dloss;
  st->keep_losses = st->train && st->last && keep_stage_losses_;
  // Which activations each layer keeps until backward. The flash path never keeps probabilities,
  // only the (B,NH,T) log-sum-exp, so for it selective is the same as none.
  const bool flash = attention_ == Attention::flash;
  st->keep_layer = st->train && recompute_ != Recompute::full;
  st->keep_att = st->train && (recompute_ == Recompute::none || (flash && st->keep_layer));
  st->emb_rows = st->train && st->first && st->last && hooks_ && hooks_->wants_row_grads(emb_unit_);
  MT_CHECK(!st->emb_rows || !tp_.active(), "row gradients of a vocabulary-parallel embedding");
  switch (store_.compute_dtype()) {
    case DType::f32: Pass<float>(*this, st->mb).forward(*st, std::move(input), mode, last_logits); break;
    case DType::bf16: Pass<bf16>(*this, st->mb).forward(*st, std::move(input), mode, last_logits); break;
    case DType::f16: Pass<f16>(*this, st->mb).forward(*st, std::move(input), mode, last_logits); break;
    default: fail("the model cannot compute in %s (expected f32, bf16 or f16)", dtype_name(store_.compute_dtype()));
  }
  return st;
}

std::unique_ptr<StageContext> GPT::stage_forward(int chunk, const MicroBatch& mb, Buffer input, float dloss,
                                                 bool train) {
  check_ready();
  check_batch(mb);
  const bool last = plan_.last && chunk + 1 == int(plan_.chunks.size());
  if (last) MT_CHECK(mb.targets != nullptr, "loss requested without targets");
  return forward_chunk(chunk, mb, std::move(input), dloss, train ? Mode::train : Mode::eval, nullptr);
}

Buffer GPT::take_stage_output(StageContext& c) {
  StageState& st = static_cast<StageState&>(c);
  if (st.last) return Buffer();
  return std::move(st.xs.back());
}

namespace {
// Runs f(Pass<S>) for the model's compute type S.
template <class F>
void with_pass(GPT& m, DType t, const MicroBatch& mb, F&& f) {
  switch (t) {
    case DType::f32: f(Pass<float>(m, mb)); break;
    case DType::bf16: f(Pass<bf16>(m, mb)); break;
    case DType::f16: f(Pass<f16>(m, mb)); break;
    default: fail("the model cannot compute in %s (expected f32, bf16 or f16)", dtype_name(t));
  }
}
}  // namespace

Buffer GPT::stage_backward(StageContext& c, Buffer dy) {
  StageState& st = static_cast<StageState&>(c);
  with_pass(*this, store_.compute_dtype(), st.mb, [&](auto&& pass) { pass.backward(st, std::move(dy)); });
  return std::move(st.dx);
}

Buffer GPT::stage_backward_input(StageContext& c, Buffer dy) {
  StageState& st = static_cast<StageState&>(c);
  with_pass(*this, store_.compute_dtype(), st.mb, [&](auto&& pass) { pass.backward(st, std::move(dy), true); });
  return std::move(st.dx);
}

void GPT::stage_backward_weight(StageContext& c) {
  StageState& st = static_cast<StageState&>(c);
  with_pass(*this, store_.compute_dtype(), st.mb, [&](auto&& pass) { pass.weight_backward(st); });
}

double GPT::stage_loss(const StageContext& c) const {
  const StageState& st = static_cast<const StageState&>(c);
  MT_CHECK(st.last && st.loss_done, "stage_loss: not the last stage, or its loss is not summed yet");
  return st.loss_sum;
}

Buffer GPT::take_stage_losses(StageContext& c) {
  StageState& st = static_cast<StageState&>(c);
  MT_CHECK(st.keep_losses && st.losses, "take_stage_losses: not the last stage's training backward with keep set, "
           "or taken twice");
  return std::move(st.losses);
}

// The whole model: every chunk of a plan that holds the first and the last stage, forward in order
// (each chunk's output the next one's input), then backward in reverse.
double GPT::run(const MicroBatch& mb, float dloss, Mode mode, float* last_logits) {
  check_ready();
  check_batch(mb);
  MT_CHECK(plan_.first && plan_.last, "the whole-model pass on a rank that holds only some pipeline stages");
  if (mode != Mode::last_logits) MT_CHECK(mb.targets != nullptr, "loss requested without targets");
  const int chunks = int(plan_.chunks.size());
  std::vector<std::unique_ptr<StageContext>> ctx;
  Buffer x;
  for (int c = 0; c < chunks; c++) {
    ctx.push_back(forward_chunk(c, mb, std::move(x), dloss, mode, last_logits));
    x = take_stage_output(*ctx.back());
    if (mode != Mode::train && c + 1 < chunks) ctx.back().reset();  // eval keeps nothing for backward
  }
  if (mode == Mode::last_logits) return 0.0;
  if (mode == Mode::eval) return stage_loss(*ctx.back());
  Buffer dy;
  for (int c = chunks - 1; c >= 0; c--) dy = stage_backward(*ctx[size_t(c)], std::move(dy));
  return stage_loss(*ctx.back());
}

double GPT::forward_backward(const MicroBatch& mb, float dloss) { return run(mb, dloss, Mode::train, nullptr); }
double GPT::forward_loss(const MicroBatch& mb) { return run(mb, 0.f, Mode::eval, nullptr); }
void GPT::forward_last_logits(const MicroBatch& mb, float* logits) { run(mb, 0.f, Mode::last_logits, logits); }

}  // namespace mt::model
