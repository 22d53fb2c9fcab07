// GPT forward and backward. Shapes: B batch, T time, C channels, NH heads, N = B*T rows,
// Vp padded vocabulary. Every op output is passed through store() where the GPU would store it in
// the compute precision, activations and activation gradients alike; parameter gradients stay fp32.
#include <algorithm>
#include <chrono>
#include <vector>

#include "model/gpt.h"
#include "runtime/check.h"

namespace mt::model {

namespace {
constexpr MemCategory kAct = MemCategory::activations;
// Rows of the classifier processed at once: bounds the logits buffer to kClassifierRows x Vp.
constexpr int kClassifierRows = 256;
}  // namespace

// The activations of one layer that backward reads. att is only allocated when it is kept.
struct GPT::LayerActs {
  Buffer ln1, ln1_mean, ln1_rstd;  // (N,C), (N), (N)
  Buffer qkv;                      // (N,3C)
  Buffer att;                      // (B,NH,T,T) softmax probabilities
  Buffer atty;                     // (N,C) attention output before the projection
  Buffer res2;                     // (N,C) residual after attention
  Buffer ln2, ln2_mean, ln2_rstd;  // (N,C), (N), (N)
  Buffer fch, fch_gelu;            // (N,4C) each

  void alloc(Arena& a, int64_t N, int64_t C, int64_t att_elems, bool with_att) {
    ln1 = a.alloc(kAct, size_t(N * C) * 4);
    ln1_mean = a.alloc(kAct, size_t(N) * 4);
    ln1_rstd = a.alloc(kAct, size_t(N) * 4);
    qkv = a.alloc(kAct, size_t(N * 3 * C) * 4);
    if (with_att) att = a.alloc(kAct, size_t(att_elems) * 4);
    atty = a.alloc(kAct, size_t(N * C) * 4);
    res2 = a.alloc(kAct, size_t(N * C) * 4);
    ln2 = a.alloc(kAct, size_t(N * C) * 4);
    ln2_mean = a.alloc(kAct, size_t(N) * 4);
    ln2_rstd = a.alloc(kAct, size_t(N) * 4);
    fch = a.alloc(kAct, size_t(N * 4 * C) * 4);
    fch_gelu = a.alloc(kAct, size_t(N * 4 * C) * 4);
  }
  bool allocated() const { return bool(ln1); }
};

// Buffers that live for one backward pass (or one forward, for the scratch attention).
struct GPT::Workspace {
  Buffer att;          // (B,NH,T,T) probabilities when a layer did not keep its own
  Buffer att_scratch;  // (B,NH,T,T) attention backward workspace
  Buffer dln, tmp, datty, xnext;  // (N,C)
  Buffer dqkv;                    // (N,3C)
  Buffer dfc1, dfc2;              // (N,4C)
};

double GPT::forward_backward(const MicroBatch& mb, float dloss) { return run(mb, dloss, Mode::train, nullptr); }
double GPT::forward_loss(const MicroBatch& mb) { return run(mb, 0.f, Mode::eval, nullptr); }
void GPT::forward_last_logits(const MicroBatch& mb, float* logits) { run(mb, 0.f, Mode::last_logits, logits); }

void GPT::layer_forward(int l, const float* x, float* x_next, LayerActs& a, int B, int T, const int32_t* doc) {
  const LayerParams& p = layers_[size_t(l)];
  const int C = cfg_.n_embd, NH = cfg_.n_head, N = B * T;
  const int64_t NC = int64_t(N) * C;
  const ops::Ctx& c = ctx_;
  const ParamStore& s = store_;
  ops::layernorm_fwd(a.ln1.f32(), a.ln1_mean.f32(), a.ln1_rstd.f32(), x, s.compute(p.ln1_w), s.compute(p.ln1_b), N, C, c);
  store(a.ln1.f32(), NC);
  ops::matmul_fwd(a.qkv.f32(), a.ln1.f32(), s.compute(p.qkv_w), s.compute(p.qkv_b), N, C, 3 * C, c);
  store(a.qkv.f32(), 3 * NC);
  ops::attention_fwd(a.atty.f32(), a.att.f32(), a.qkv.f32(), doc, B, T, C, NH, c);
  store(a.atty.f32(), NC);
  store(a.att.f32(), int64_t(B) * NH * T * T);
  ops::matmul_fwd(x_next, a.atty.f32(), s.compute(p.proj_w), s.compute(p.proj_b), N, C, C, c);
  store(x_next, NC);
  ops::add(a.res2.f32(), x, x_next, NC, c);
  store(a.res2.f32(), NC);
  ops::layernorm_fwd(a.ln2.f32(), a.ln2_mean.f32(), a.ln2_rstd.f32(), a.res2.f32(), s.compute(p.ln2_w),
                     s.compute(p.ln2_b), N, C, c);
  store(a.ln2.f32(), NC);
  ops::matmul_fwd(a.fch.f32(), a.ln2.f32(), s.compute(p.fc_w), s.compute(p.fc_b), N, C, 4 * C, c);
  store(a.fch.f32(), 4 * NC);
  ops::gelu_fwd(a.fch_gelu.f32(), a.fch.f32(), 4 * NC, c);
  store(a.fch_gelu.f32(), 4 * NC);
  ops::matmul_fwd(x_next, a.fch_gelu.f32(), s.compute(p.fcproj_w), s.compute(p.fcproj_b), N, 4 * C, C, c);
  store(x_next, NC);
  ops::add(x_next, a.res2.f32(), x_next, NC, c);
  store(x_next, NC);
}

// On entry dx holds dL/d(layer output); on exit dL/d(layer input).
void GPT::layer_backward(int l, float* dx, const float* x, LayerActs& a, Workspace& w, int B, int T,
                         const int32_t* doc) {
  const LayerParams& p = layers_[size_t(l)];
  const int C = cfg_.n_embd, NH = cfg_.n_head, N = B * T;
  const int64_t NC = int64_t(N) * C;
  const ops::Ctx& c = ctx_;
  const ParamStore& s = store_;
  // MLP: x_next = res2 + fcproj(gelu(fc(ln2(res2))))
  ops::matmul_bwd(w.dfc1.f32(), store_.grad(p.fcproj_w), store_.grad(p.fcproj_b), dx, a.fch_gelu.f32(),
                  s.compute(p.fcproj_w), N, 4 * C, C, c);
  store(w.dfc1.f32(), 4 * NC);
  ops::gelu_bwd(w.dfc2.f32(), w.dfc1.f32(), a.fch.f32(), 4 * NC, c);
  store(w.dfc2.f32(), 4 * NC);
  ops::matmul_bwd(w.dln.f32(), store_.grad(p.fc_w), store_.grad(p.fc_b), w.dfc2.f32(), a.ln2.f32(),
                  s.compute(p.fc_w), N, C, 4 * C, c);
  store(w.dln.f32(), NC);
  ops::layernorm_bwd(w.tmp.f32(), store_.grad(p.ln2_w), store_.grad(p.ln2_b), w.dln.f32(), a.res2.f32(),
                     s.compute(p.ln2_w), a.ln2_mean.f32(), a.ln2_rstd.f32(), N, C, c);
  ops::add(dx, dx, w.tmp.f32(), NC, c);  // dres2 = residual path + LayerNorm path
  store(dx, NC);
  // Attention: res2 = x + proj(attn(qkv(ln1(x))))
  ops::matmul_bwd(w.datty.f32(), store_.grad(p.proj_w), store_.grad(p.proj_b), dx, a.atty.f32(),
                  s.compute(p.proj_w), N, C, C, c);
  store(w.datty.f32(), NC);
  const float* att = a.att.f32();
  if (!a.att) {  // selective recompute: rebuild the probabilities from the saved qkv
    ops::attention_fwd(w.tmp.f32(), w.att.f32(), a.qkv.f32(), doc, B, T, C, NH, c);
    store(w.att.f32(), int64_t(B) * NH * T * T);
    att = w.att.f32();
  }
  ops::attention_bwd(w.dqkv.f32(), w.att_scratch.f32(), w.datty.f32(), a.qkv.f32(), att, doc, B, T, C, NH, c);
  store(w.dqkv.f32(), 3 * NC);
  ops::matmul_bwd(w.dln.f32(), store_.grad(p.qkv_w), store_.grad(p.qkv_b), w.dqkv.f32(), a.ln1.f32(),
                  s.compute(p.qkv_w), N, C, 3 * C, c);
  store(w.dln.f32(), NC);
  ops::layernorm_bwd(w.tmp.f32(), store_.grad(p.ln1_w), store_.grad(p.ln1_b), w.dln.f32(), x,
                     s.compute(p.ln1_w), a.ln1_mean.f32(), a.ln1_rstd.f32(), N, C, c);
  ops::add(dx, dx, w.tmp.f32(), NC, c);
  store(dx, NC);
}

double GPT::classifier(const float* lnf, float* dlnf, const int32_t* targets, float dloss, int N, bool grads) {
  const int C = cfg_.n_embd, V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
  const int rows = std::min(N, kClassifierRows);
  Buffer logits = arena_->alloc(kAct, size_t(rows) * Vp * 4);
  Buffer losses = arena_->alloc(kAct, size_t(N) * 4);
  for (int r0 = 0; r0 < N; r0 += rows) {
    const int n = std::min(rows, N - r0);
    ops::matmul_fwd(logits.f32(), lnf + int64_t(r0) * C, store_.compute(wte_), nullptr, n, C, Vp, ctx_);
    store(logits.f32(), int64_t(n) * Vp);
    ops::softmax_xent(losses.f32() + r0, grads ? logits.f32() : nullptr, logits.f32(), targets + r0, dloss, n, V,
                      Vp, ctx_);
    if (grads) {
      store(logits.f32(), int64_t(n) * Vp);
      ops::matmul_bwd(dlnf + int64_t(r0) * C, store_.grad(wte_), nullptr, logits.f32(), lnf + int64_t(r0) * C,
                      store_.compute(wte_), n, C, Vp, ctx_);
    }
  }
  // The per-row losses come back to the host once per micro-batch: on a device a synchronisation,
  // which the logged loss needs anyway.
  std::vector<float> host_losses(static_cast<size_t>(N));
  arena_->mem().download(host_losses.data(), losses.f32(), size_t(N) * 4);
  double sum = 0;  // fixed order: deterministic
  for (int i = 0; i < N; i++) sum += double(host_losses[size_t(i)]);
  return sum;
}

double GPT::run(const MicroBatch& mb, float dloss, Mode mode, float* last_logits) {
  MT_CHECK(arena_ != nullptr, "GPT::run without an arena (call set_arena)");
  MT_CHECK(store_.finalized(), "GPT::run before the ParamStore is finalized");
  check_batch(mb);
  if (mode != Mode::last_logits) MT_CHECK(mb.targets != nullptr, "loss requested without targets");
  const int B = mb.B, T = mb.T, C = cfg_.n_embd, NH = cfg_.n_head, L = cfg_.n_layer, N = B * T;
  const int64_t NC = int64_t(N) * C, att_elems = int64_t(B) * NH * T * T;
  Arena& ar = *arena_;
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  const bool train = mode == Mode::train;
  // Which activations each layer keeps until backward.
  const bool keep_layer = train && recompute_ != Recompute::full;
  const bool keep_att = train && recompute_ == Recompute::none;
  const int emb = 0, fin = final_unit();
  if (train && phase_hook_) phase_hook_("forward");

  // The ops read the micro-batch where the arena's memory is: on a device, upload the host arrays
  // (check_batch has validated them on the host). On the CPU these are the caller's arrays.
  std::vector<Buffer> uploads;
  auto on_device = [&](const int32_t* host) -> const int32_t* {
    if (!host || ar.device() == Device::cpu) return host;
    uploads.push_back(ar.alloc(kAct, size_t(N) * 4));
    ar.mem().upload(uploads.back().data(), host, size_t(N) * 4);
    return uploads.back().i32();
  };
  const int32_t* tokens = on_device(mb.tokens);
  const int32_t* targets = on_device(mb.targets);
  const int32_t* positions = on_device(mb.positions);
  const int32_t* doc = on_device(mb.doc_ids);

  std::vector<Buffer> xs(static_cast<size_t>(L) + 1);  // residual stream: xs[l] is layer l's input
  std::vector<LayerActs> acts(static_cast<size_t>(L));
  LayerActs scratch;
  Workspace w;
  if (!keep_att) w.att = ar.alloc(kAct, size_t(att_elems) * 4);
  if (!keep_layer) scratch.alloc(ar, N, C, 0, false);

  // Forward. In eval mode only the current residual is kept (xs[l] freed as soon as it is consumed).
  xs[0] = ar.alloc(kAct, size_t(NC) * 4);
  acquire(emb, false);
  ops::encoder_fwd(xs[0].f32(), tokens, positions, store_.compute(wte_), store_.compute(wpe_), B, T, C, ctx_);
  release(emb);
  store(xs[0].f32(), NC);
  for (int l = 0; l < L; l++) {
    LayerActs& a = keep_layer ? acts[size_t(l)] : scratch;
    if (keep_layer) a.alloc(ar, N, C, att_elems, keep_att);
    xs[size_t(l) + 1] = ar.alloc(kAct, size_t(NC) * 4);
    if (!keep_att) std::swap(a.att, w.att);  // borrow the shared probabilities buffer
    acquire(layer_unit(l), false);
    layer_forward(l, xs[size_t(l)].f32(), xs[size_t(l) + 1].f32(), a, B, T, doc);
    release(layer_unit(l));
    if (!keep_att) std::swap(a.att, w.att);
    if (!train) xs[size_t(l)].reset();
  }

  // Final LayerNorm and the classifier.
  const float* xL = xs[size_t(L)].f32();
  Buffer lnf = ar.alloc(kAct, size_t(NC) * 4), lnf_mean = ar.alloc(kAct, size_t(N) * 4),
         lnf_rstd = ar.alloc(kAct, size_t(N) * 4);
  acquire(fin, train);
  ops::layernorm_fwd(lnf.f32(), lnf_mean.f32(), lnf_rstd.f32(), xL, store_.compute(lnf_w_), store_.compute(lnf_b_), N,
                     C, ctx_);
  store(lnf.f32(), NC);
  if (mode == Mode::last_logits) {
    release(fin);
    const int Vp = cfg_.padded_vocab();
    Buffer lg = ar.alloc(kAct, size_t(Vp) * 4);
    acquire(emb, false);
    ops::matmul_fwd(lg.f32(), lnf.f32() + int64_t(T - 1) * C, store_.compute(wte_), nullptr, 1, C, Vp, ctx_);
    release(emb);
    ar.mem().download(last_logits, lg.f32(), size_t(cfg_.vocab_size) * 4);
    return 0.0;
  }
  Buffer dlnf;
  if (train) dlnf = ar.alloc(kAct, size_t(NC) * 4);
  acquire(emb, train);  // the tied unembedding; its gradient buffer stays until the encoder's backward
  const double loss_sum = classifier(lnf.f32(), dlnf.f32(), targets, dloss, N, train);
  release(emb);
  // Data parallelism may take the embeddings' remaining (sparse) gradient as rows, so that the large
  // dense part can be reduced from here on, overlapping the whole backward.
  const bool emb_rows = train && hooks_ && hooks_->wants_row_grads(emb);
  if (emb_rows) grads_ready(emb);
  const auto t_forward = clock::now();
  times_.forward += std::chrono::duration<double>(t_forward - t_start).count();
  if (!train) {
    release(fin);
    return loss_sum;
  }

  // Backward: reverse loop over the layers.
  if (phase_hook_) phase_hook_("backward");
  Buffer dx = ar.alloc(kAct, size_t(NC) * 4);
  ops::layernorm_bwd(dx.f32(), store_.grad(lnf_w_), store_.grad(lnf_b_), dlnf.f32(), xL, store_.compute(lnf_w_),
                     lnf_mean.f32(), lnf_rstd.f32(), N, C, ctx_);
  store(dx.f32(), NC);
  release(fin);
  grads_ready(fin);
  lnf.reset();
  dlnf.reset();
  w.att_scratch = ar.alloc(kAct, size_t(att_elems) * 4);
  w.dln = ar.alloc(kAct, size_t(NC) * 4);
  w.tmp = ar.alloc(kAct, size_t(NC) * 4);
  w.datty = ar.alloc(kAct, size_t(NC) * 4);
  w.dqkv = ar.alloc(kAct, size_t(3 * NC) * 4);
  w.dfc1 = ar.alloc(kAct, size_t(4 * NC) * 4);
  w.dfc2 = ar.alloc(kAct, size_t(4 * NC) * 4);
  if (!keep_layer) w.xnext = ar.alloc(kAct, size_t(NC) * 4);
  for (int l = L - 1; l >= 0; l--) {
    xs[size_t(l) + 1].reset();
    LayerActs& a = keep_layer ? acts[size_t(l)] : scratch;
    acquire(layer_unit(l), true);
    if (keep_layer) {
      layer_backward(l, dx.f32(), xs[size_t(l)].f32(), a, w, B, T, doc);
    } else {  // full recompute: re-run this layer's forward from its saved input, then its backward
      std::swap(a.att, w.att);
      layer_forward(l, xs[size_t(l)].f32(), w.xnext.f32(), a, B, T, doc);
      layer_backward(l, dx.f32(), xs[size_t(l)].f32(), a, w, B, T, doc);
      std::swap(a.att, w.att);
    }
    release(layer_unit(l));
    grads_ready(layer_unit(l));
    if (keep_layer) a = LayerActs();
  }
  if (emb_rows) {
    // d wte[tokens[i]] += dx[i] and d wpe[positions[i]] += dx[i]: the encoder's backward, as rows.
    // Host rows: data parallelism over several ranks runs on the CPU backend only.
    std::vector<int32_t> pos(mb.positions ? mb.positions : nullptr, mb.positions ? mb.positions + N : nullptr);
    if (!mb.positions) {
      pos.resize(size_t(N));
      for (int i = 0; i < N; i++) pos[size_t(i)] = i % T;
    }
    hooks_->add_row_grads(emb, {UnitHooks::RowGrads{wte_, mb.tokens, dx.f32(), N, C},
                                UnitHooks::RowGrads{wpe_, pos.data(), dx.f32(), N, C}});
  } else {
    acquire(emb, true);
    ops::encoder_bwd(store_.grad(wte_), store_.grad(wpe_), dx.f32(), tokens, positions, B, T, C, ctx_);
    release(emb);
    grads_ready(emb);
  }
  ar.mem().sync();  // device kernels run asynchronously: time their completion, not their launch
  times_.backward += std::chrono::duration<double>(clock::now() - t_forward).count();
  return loss_sum;
}

}  // namespace mt::model
