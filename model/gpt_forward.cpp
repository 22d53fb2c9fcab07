// GPT forward and backward in the run's storage type S (float, bf16 or f16; runtime/storage.h).
// Shapes: B batch, T time, C channels, NH heads, N = B*T rows, Vp padded vocabulary. Activations and
// activation gradients are S; parameter gradients, LayerNorm statistics, losses and the flash
// attention's log-sum-exp are fp32. Each op rounds its output once, where the GPU stores it.
//
// Tensor parallelism (parallel/tensor_parallel.h): with P ranks a layer's GEMMs use this rank's
// slices (c_attn: NH/P heads, c_fc: 4C/P features; the row-parallel projections' partial products
// summed over tp), and with sequence parallelism the residual stream, the LayerNorms and their
// activations hold Ns = N/P rows. The inputs of the column-parallel GEMMs are all-gathered to N rows
// for the GEMM and not kept: backward gathers them again while it computes the input gradient, and
// reduce-scatters that gradient while it computes the weight gradient (Megatron-LM's overlap), so a
// layer keeps 1/P of every activation. With P = 1 none of this applies and the pass is the
// single-rank one, operation for operation.
//
// Fused ops used here (kernels/ops.h): the attention residual with the second LayerNorm, GELU as the
// epilogue of the first MLP matmul (and its derivative in the backward of the second), and the
// residual gradient accumulated by the LayerNorm backward.
#include <algorithm>
#include <chrono>
#include <type_traits>
#include <vector>

#include "model/gpt.h"
#include "runtime/check.h"

namespace mt::model {

namespace {
constexpr MemCategory kAct = MemCategory::activations;
// Rows of the classifier processed at once, which bounds the (rows, Vp) logits buffer. Each chunk's
// backward adds its wte gradient into the fp32 (Vp, C) accumulator, a read and a write of 4 Vp C
// bytes (155 MiB each for GPT-2), so on a GPU, where that traffic rather than the GEMM sets the
// chunk's cost, chunks are as large as a 1 GiB logits buffer allows (8192 rows for GPT-2 in bf16:
// 4 chunks of a 32k-token micro-batch instead of 128), split evenly. The CPU keeps 256-row chunks.
constexpr int kCpuClassifierRows = 256;
constexpr size_t kDeviceLogitsBytes = size_t(1) << 30;

int classifier_rows(Device device, int N, int Vp, size_t elem_bytes) {
  if (device != Device::cuda) return std::min(N, kCpuClassifierRows);
  const int most = std::max(kCpuClassifierRows, int(kDeviceLogitsBytes / (size_t(Vp) * elem_bytes)));
  const int chunks = (N + most - 1) / most;
  return (N + chunks - 1) / chunks;
}
}  // namespace

template <class S>
class Pass {
 public:
  Pass(GPT& m, const MicroBatch& mb)
      : m_(m), s_(m.store_), ar_(*m.arena_), c_(m.ctx_), mb_(mb), tp_(m.tp_), B_(mb.B), T_(mb.T), C_(m.cfg_.n_embd),
        NH_(m.cfg_.n_head), N_(mb.B * mb.T), P_(tp_.size()), Ns_(int(tp_.own_rows(N_))), Cl_(C_ / P_),
        NHl_(NH_ / P_), NC_(int64_t(Ns_) * C_), flash_(m.attention_ == Attention::flash) {}

  double run(float dloss, GPT::Mode mode, float* last_logits);

 private:
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
    Buffer fch, fch_gelu;            // (N,4C/P) each: before and after GELU
    bool allocated() const { return bool(ln1); }
  };
  // Buffers that live for one backward pass (or one forward, for the shared attention buffer).
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
  void column_parallel_bwd(S* dinp_own, float* dw, float* db, const S* dout, const S* inp_own, const S* w, int OC,
                           Workspace& ws);
  // A row-parallel bias is added by one rank, so that the sum over tp holds it once.
  const S* bias_once(int i) const { return tp_.rank() == 0 ? w(i) : nullptr; }
  void alloc_layer(LayerActs& a, bool with_att);

  // The weight entry i as the ops read it, in S.
  const S* w(int i) const;
  // Unit u's parameters (and gradient buffer) about to be used: the hooks materialise them.
  void acquire(int u, bool grads) { m_.acquire(u, grads); }
  float* g(int i) const { return s_.grad(i); }

  void layer_forward(int l, const S* x, S* x_next, LayerActs& a, Workspace& ws, const int32_t* doc);
  void layer_backward(int l, S* dx, const S* x, LayerActs& a, Workspace& ws, const int32_t* doc);
  // Fills `losses` (N, fp32) with the per-token losses and, if grads, dlnf and wte's gradient.
  // lnf: all N rows; dlnf: (N,C), under tensor parallelism this rank's partial sum.
  void classifier(float* losses, const S* lnf, S* dlnf, const int32_t* targets, float dloss, bool grads);
  double sum_losses(const Buffer& losses);
  void last_logits(const S* lnf, float* out);

  GPT& m_;
  ParamStore& s_;
  Arena& ar_;
  const ops::Ctx& c_;
  const MicroBatch& mb_;
  const parallel::TensorParallel& tp_;
  // N rows of the micro-batch; P tp ranks; Ns rows of the residual stream held here (N/P under
  // sequence parallelism); Cl = C/P attention width and NHl = NH/P heads held here.
  const int B_, T_, C_, NH_, N_, P_, Ns_, Cl_, NHl_;
  const int64_t NC_;  // Ns x C: the residual stream held here
  const bool flash_;
};

template <class S>
void Pass<S>::alloc_layer(LayerActs& a, bool with_att) {
  const int64_t NCl = int64_t(N_) * Cl_;
  a.ln1 = act(NC_);
  a.ln1_mean = f32(Ns_);
  a.ln1_rstd = f32(Ns_);
  a.qkv = act(3 * NCl);
  if (with_att) {
    if (flash_) a.lse = f32(lse_elems());
    else a.att = act(att_elems());
  }
  a.atty = act(NCl);
  a.res2 = act(NC_);
  a.ln2 = act(NC_);
  a.ln2_mean = f32(Ns_);
  a.ln2_rstd = f32(Ns_);
  a.fch = act(4 * NCl);
  a.fch_gelu = act(4 * NCl);
}

template <class S>
const S* Pass<S>::w(int i) const {
  const ParamEntry& e = s_.entry(i);
  MT_CHECK(m_.acquired_[size_t(e.unit)], "weight '%s' read outside an acquire of its unit", e.name.c_str());
  return s_.compute_as<S>(i);
}

template <class S>
void Pass<S>::layer_forward(int l, const S* x, S* x_next, LayerActs& a, Workspace& ws, const int32_t* doc) {
  const LayerParams& lp = m_.layers_[size_t(l)];
  const int C = C_, N = N_, Ns = Ns_, Cl = Cl_, F = 4 * C_ / P_;
  ops::layernorm_fwd(p(a.ln1), a.ln1_mean.f32(), a.ln1_rstd.f32(), x, w(lp.ln1_w), w(lp.ln1_b), Ns, C, c_);
  const S* ln1 = gathered(ws.ln_all, p(a.ln1));
  ops::matmul_fwd(p(a.qkv), ln1, w(lp.qkv_w), w(lp.qkv_b), N, C, 3 * Cl, c_);
  if (flash_) ops::flash_attention_fwd(p(a.atty), a.lse.f32(), p(a.qkv), doc, B_, T_, Cl, NHl_, c_);
  else ops::attention_fwd(p(a.atty), p(a.att), p(a.qkv), doc, B_, T_, Cl, NHl_, c_);
  ops::matmul_fwd(partial_out(ws, x_next), p(a.atty), w(lp.proj_w), bias_once(lp.proj_b), N, Cl, C, c_);
  sum_partial(x_next, ws);
  // res2 = x + attention branch, and its LayerNorm, in one pass.
  ops::residual_layernorm_fwd(p(a.res2), p(a.ln2), a.ln2_mean.f32(), a.ln2_rstd.f32(), x, x_next, w(lp.ln2_w),
                              w(lp.ln2_b), Ns, C, c_);
  const S* ln2 = gathered(ws.ln_all, p(a.ln2));
  ops::matmul_fwd(p(a.fch_gelu), ln2, w(lp.fc_w), w(lp.fc_b), N, C, F, c_, p(a.fch));  // GELU epilogue
  if (!tp_.active()) {
    // x_next = res2 + MLP branch: the residual is the GEMM's C, added before the one rounding.
    ops::matmul_fwd(x_next, p(a.fch_gelu), w(lp.fcproj_w), w(lp.fcproj_b), N, 4 * C, C, c_,
                    static_cast<S*>(nullptr), p(a.res2));
    return;
  }
  // Under tensor parallelism the residual can only be added after the sum over tp.
  ops::matmul_fwd(partial_out(ws, x_next), p(a.fch_gelu), w(lp.fcproj_w), bias_once(lp.fcproj_b), N, F, C, c_);
  sum_partial(x_next, ws);
  ops::add(x_next, x_next, p(a.res2), NC_, c_);
}

// On entry dx holds dL/d(layer output); on exit dL/d(layer input) (this rank's Ns rows).
template <class S>
void Pass<S>::layer_backward(int l, S* dx, const S* x, LayerActs& a, Workspace& ws, const int32_t* doc) {
  const LayerParams& lp = m_.layers_[size_t(l)];
  const int C = C_, N = N_, Ns = Ns_, Cl = Cl_, F = 4 * C_ / P_;
  // MLP: x_next = res2 + fcproj(gelu(fc(ln2(res2)))). The first backward applies GELU's derivative.
  const S* dx_all = gathered(ws.dx_all, dx);
  ops::matmul_bwd(p(ws.dfc), g(lp.fcproj_w), g(lp.fcproj_b), dx_all, p(a.fch_gelu), w(lp.fcproj_w), N, F, C, c_,
                  p(a.fch));
  column_parallel_bwd(p(ws.dln), g(lp.fc_w), g(lp.fc_b), p(ws.dfc), p(a.ln2), w(lp.fc_w), F, ws);
  // dres2 = residual path (already in dx) + LayerNorm path, accumulated by the LayerNorm backward.
  ops::layernorm_bwd(dx, g(lp.ln2_w), g(lp.ln2_b), p(ws.dln), p(a.res2), w(lp.ln2_w), a.ln2_mean.f32(),
                     a.ln2_rstd.f32(), Ns, C, true, c_);
  // Attention: res2 = x + proj(attn(qkv(ln1(x))))
  dx_all = gathered(ws.dx_all, dx);
  ops::matmul_bwd(p(ws.datty), g(lp.proj_w), g(lp.proj_b), dx_all, p(a.atty), w(lp.proj_w), N, Cl, C, c_);
  if (flash_) {
    ops::flash_attention_bwd(p(ws.dqkv), ws.att_scratch.f32(), p(ws.datty), p(a.qkv), p(a.atty), a.lse.f32(), doc,
                             B_, T_, Cl, NHl_, c_);
  } else {
    const S* att = p(a.att);
    if (!a.att) {  // selective recompute: rebuild the probabilities from the saved qkv (dln is free now)
      ops::attention_fwd(p(ws.dln), p(ws.att), p(a.qkv), doc, B_, T_, Cl, NHl_, c_);
      att = p(ws.att);
    }
    ops::attention_bwd(p(ws.dqkv), ws.att_scratch.f32(), p(ws.datty), p(a.qkv), att, doc, B_, T_, Cl, NHl_, c_);
  }
  column_parallel_bwd(p(ws.dln), g(lp.qkv_w), g(lp.qkv_b), p(ws.dqkv), p(a.ln1), w(lp.qkv_w), 3 * Cl, ws);
  ops::layernorm_bwd(dx, g(lp.ln1_w), g(lp.ln1_b), p(ws.dln), x, w(lp.ln1_w), a.ln1_mean.f32(), a.ln1_rstd.f32(), Ns,
                     C, true, c_);
}

template <class S>
void Pass<S>::column_parallel_bwd(S* dinp_own, float* dw, float* db, const S* dout, const S* inp_own, const S* w,
                                  int OC, Workspace& ws) {
  const int N = N_, C = C_;
  if (!tp_.active()) {
    ops::matmul_bwd(dinp_own, dw, db, dout, inp_own, w, N, C, OC, c_);
    return;
  }
  parallel::Comm& tc = tp_.data_comm();
  const bool sp = tp_.splits_sequence();
  const DType t = dtype_of<S>();
  parallel::CommHandle gather, sum;
  if (sp) gather = tc.all_gather_async(inp_own, p(ws.ln_all), size_t(Ns_) * C, t);
  S* partial = partial_out(ws, dinp_own);
  ops::matmul_bwd(partial, nullptr, nullptr, dout, static_cast<const S*>(nullptr), w, N, C, OC, c_);
  if (sp)
    sum = tc.reduce_scatter_async(partial, dinp_own, size_t(Ns_) * C, t, parallel::ReduceOp::sum);
  else
    sum = tc.all_reduce_async(dinp_own, size_t(N) * C, t, parallel::ReduceOp::sum);
  gather.wait();
  ops::matmul_bwd(static_cast<S*>(nullptr), dw, db, dout, sp ? p(ws.ln_all) : inp_own, w, N, C, OC, c_);
  sum.wait();
}

template <class S>
void Pass<S>::classifier(float* losses, const S* lnf, S* dlnf, const int32_t* targets, float dloss, bool grads) {
  // Under tensor parallelism this rank holds Vl = Vp/P rows of wte, so it computes columns
  // [col0, col0 + Vl) of the logits; the softmax statistics of the slices are merged over tp.
  const int C = C_, N = N_, V = m_.cfg_.vocab_size, Vl = m_.cfg_.padded_vocab() / P_, col0 = tp_.rank() * Vl;
  const int rows = classifier_rows(c_.device, N, Vl, sizeof(S));
  Buffer logits = act(int64_t(rows) * Vl);
  Buffer stats, stats_all;
  if (tp_.active()) {
    stats = f32(int64_t(rows) * 3);
    stats_all = f32(int64_t(rows) * 3 * P_);
  }
  for (int r0 = 0; r0 < N; r0 += rows) {
    const int n = std::min(rows, N - r0);
    ops::matmul_fwd(p(logits), lnf + int64_t(r0) * C, w(m_.wte_), static_cast<const S*>(nullptr), n, C, Vl, c_);
    S* dlogits = grads ? p(logits) : nullptr;
    if (!tp_.active()) {
      ops::softmax_xent(losses + r0, dlogits, p(logits), targets + r0, dloss, n, V, Vl, c_);
    } else {
      ops::xent_slice_stats(stats.f32(), p(logits), targets + r0, col0, n, V, Vl, c_);
      tp_.data_comm().all_gather(stats.f32(), stats_all.f32(), size_t(n) * 3, DType::f32);
      ops::xent_slice_finish(losses + r0, dlogits, p(logits), stats_all.f32(), P_, targets + r0, dloss, col0, n, V,
                             Vl, c_);
    }
    if (grads) {
      ops::matmul_bwd(dlnf + int64_t(r0) * C, g(m_.wte_), nullptr, p(logits), lnf + int64_t(r0) * C, w(m_.wte_), n,
                      C, Vl, c_);
    }
  }
}

// The per-row losses come back to the host once per micro-batch, after its backward has been
// queued: on a device the step's one synchronisation, which the logged loss needs anyway.
template <class S>
double Pass<S>::sum_losses(const Buffer& losses) {
  std::vector<float> host(static_cast<size_t>(N_));
  ar_.mem().download(host.data(), losses.f32(), size_t(N_) * 4);
  double sum = 0;  // fixed order: deterministic
  for (float x : host) sum += double(x);
  return sum;
}

template <class S>
void Pass<S>::last_logits(const S* lnf, float* out) {
  const int C = C_, Vp = m_.cfg_.padded_vocab();
  Buffer lg = act(Vp), lg32 = f32(Vp);
  ops::matmul_fwd(p(lg), lnf + int64_t(T_ - 1) * C, w(m_.wte_), static_cast<const S*>(nullptr), 1, C, Vp, c_);
  ops::convert(lg32.f32(), p(lg), Vp, c_);
  ar_.mem().download(out, lg32.f32(), size_t(m_.cfg_.vocab_size) * 4);
}

template <class S>
double Pass<S>::run(float dloss, GPT::Mode mode, float* last_logits_out) {
  const int B = B_, T = T_, C = C_, L = m_.cfg_.n_layer, N = N_, Ns = Ns_;
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  const bool train = mode == GPT::Mode::train;
  // Which activations each layer keeps until backward. The flash path never keeps probabilities,
  // only the (B,NH,T) log-sum-exp, so for it selective is the same as none.
  const bool keep_layer = train && m_.recompute_ != Recompute::full;
  const bool keep_att = train && (m_.recompute_ == Recompute::none || (flash_ && keep_layer));
  const int emb = 0, fin = m_.final_unit();
  MT_CHECK(mode != GPT::Mode::last_logits || !tp_.active(), "sampling runs on one rank (tp = 1)");
  if (train && m_.phase_hook_) m_.phase_hook_("forward");

  // The ops read the micro-batch where the arena's memory is: on a device, upload the host arrays
  // (check_batch has validated them on the host). On the CPU these are the caller's arrays.
  std::vector<Buffer> uploads;
  auto on_device = [&](const int32_t* host, int64_t n) -> const int32_t* {
    if (!host || ar_.device() == Device::cpu) return host;
    uploads.push_back(ar_.alloc(kAct, size_t(n) * 4));
    ar_.mem().upload(uploads.back().data(), host, size_t(n) * 4);
    return uploads.back().i32();
  };
  const int32_t* tokens = on_device(mb_.tokens, N);
  const int32_t* targets = on_device(mb_.targets, N);
  const int32_t* positions = on_device(mb_.positions, N);
  const int32_t* doc = on_device(mb_.doc_ids, N);
  // Tensor parallelism adds the position embedding to this rank's own rows only: their positions.
  std::vector<int32_t> own_pos_host;
  const int32_t* own_pos = nullptr;
  if (tp_.active()) {
    const int64_t r0 = tp_.first_row(N);
    for (int64_t i = r0; i < r0 + Ns; i++) own_pos_host.push_back(mb_.positions ? mb_.positions[i] : int32_t(i % T));
    own_pos = on_device(own_pos_host.data(), Ns);
  }

  std::vector<Buffer> xs(static_cast<size_t>(L) + 1);  // residual stream: xs[l] is layer l's input
  std::vector<LayerActs> acts(static_cast<size_t>(L));
  LayerActs scratch;
  Workspace ws;
  if (tp_.splits_sequence()) {
    ws.partial = act(all_rows_elems());
    ws.ln_all = act(all_rows_elems());
  }
  // A layer that does not keep its attention state borrows one shared buffer for it.
  if (!keep_att) ws.att = flash_ ? f32(lse_elems()) : act(att_elems());
  if (!keep_layer) alloc_layer(scratch, false);
  auto borrow_att = [&](LayerActs& a) { std::swap(flash_ ? a.lse : a.att, ws.att); };

  // Forward. In eval mode only the current residual is kept (xs[l] freed as soon as it is consumed).
  xs[0] = act(NC_);
  acquire(emb, false);
  if (!tp_.active()) {
    ops::encoder_fwd(p(xs[0]), tokens, positions, w(m_.wte_), w(m_.wpe_), B, T, C, c_);
  } else {
    // This rank's vocabulary rows (other ids give zero rows), summed over tp, plus the positions.
    const int Vl = m_.cfg_.padded_vocab() / P_;
    ops::embedding_fwd(partial_out(ws, p(xs[0])), tokens, w(m_.wte_), tp_.rank() * Vl, Vl, N, C, c_);
    sum_partial(p(xs[0]), ws);
    Buffer pe = act(NC_);
    ops::embedding_fwd(p(pe), own_pos, w(m_.wpe_), 0, m_.cfg_.block_size, Ns, C, c_);
    ops::add(p(xs[0]), p(xs[0]), p(pe), NC_, c_);
  }
  m_.release(emb);
  for (int l = 0; l < L; l++) {
    LayerActs& a = keep_layer ? acts[size_t(l)] : scratch;
    if (keep_layer) alloc_layer(a, keep_att);
    xs[size_t(l) + 1] = act(NC_);
    if (!keep_att) borrow_att(a);
    acquire(GPT::layer_unit(l), false);
    layer_forward(l, p(xs[size_t(l)]), p(xs[size_t(l) + 1]), a, ws, doc);
    m_.release(GPT::layer_unit(l));
    if (!keep_att) borrow_att(a);
    if (!train) xs[size_t(l)].reset();
  }

  // Final LayerNorm and the classifier (over all N rows: gathered under sequence parallelism).
  const S* xL = p(xs[size_t(L)]);
  Buffer lnf = act(NC_), lnf_mean = f32(Ns), lnf_rstd = f32(Ns);
  acquire(fin, train);
  ops::layernorm_fwd(p(lnf), lnf_mean.f32(), lnf_rstd.f32(), xL, w(m_.lnf_w_), w(m_.lnf_b_), Ns, C, c_);
  if (mode == GPT::Mode::last_logits) {
    m_.release(fin);
    acquire(emb, false);
    last_logits(p(lnf), last_logits_out);
    m_.release(emb);
    return 0.0;
  }
  const S* lnf_rows = gathered(ws.ln_all, p(lnf));
  Buffer dlnf;
  if (train) dlnf = act(NC_);
  acquire(emb, train);  // the tied unembedding; its gradient buffer stays until the encoder's backward
  Buffer losses = f32(N);
  classifier(losses.f32(), lnf_rows, train ? partial_out(ws, p(dlnf)) : nullptr, targets, dloss, train);
  if (train) sum_partial(p(dlnf), ws);
  m_.release(emb);
  // Data parallelism may take the embeddings' remaining (sparse) gradient as rows, so that the large
  // dense part can be reduced from here on, overlapping the whole backward.
  UnitHooks* hooks = m_.hooks_;
  const bool emb_rows = train && hooks && hooks->wants_row_grads(emb);
  MT_CHECK(!emb_rows || !tp_.active(), "row gradients of a vocabulary-parallel embedding");
  if (emb_rows) m_.grads_ready(emb);
  const auto t_forward = clock::now();
  m_.times_.forward += std::chrono::duration<double>(t_forward - t_start).count();
  if (!train) {
    m_.release(fin);
    return sum_losses(losses);
  }

  // Backward: reverse loop over the layers.
  if (m_.phase_hook_) m_.phase_hook_("backward");
  Buffer dx = act(NC_);
  ops::layernorm_bwd(p(dx), g(m_.lnf_w_), g(m_.lnf_b_), p(dlnf), xL, w(m_.lnf_w_), lnf_mean.f32(), lnf_rstd.f32(), Ns,
                     C, false, c_);
  m_.release(fin);
  m_.grads_ready(fin);
  lnf.reset();
  dlnf.reset();
  const int64_t NCl = int64_t(N) * Cl_;
  ws.att_scratch = f32(flash_ ? lse_elems() : att_elems());
  ws.dln = act(NC_);
  ws.datty = act(NCl);
  ws.dqkv = act(3 * NCl);
  ws.dfc = act(4 * NCl);
  if (!keep_layer) ws.xnext = act(NC_);
  for (int l = L - 1; l >= 0; l--) {
    xs[size_t(l) + 1].reset();
    LayerActs& a = keep_layer ? acts[size_t(l)] : scratch;
    acquire(GPT::layer_unit(l), true);
    if (keep_layer) {
      layer_backward(l, p(dx), p(xs[size_t(l)]), a, ws, doc);
    } else {  // full recompute: re-run this layer's forward from its saved input, then its backward
      borrow_att(a);
      layer_forward(l, p(xs[size_t(l)]), p(ws.xnext), a, ws, doc);
      layer_backward(l, p(dx), p(xs[size_t(l)]), a, ws, doc);
      borrow_att(a);
    }
    m_.release(GPT::layer_unit(l));
    m_.grads_ready(GPT::layer_unit(l));
    if (keep_layer) a = LayerActs();
  }
  if (emb_rows) {
    // d wte[tokens[i]] += dx[i] and d wpe[positions[i]] += dx[i]: the encoder's backward, as rows.
    // Host rows: data parallelism over several ranks runs on the CPU backend only.
    std::vector<int32_t> pos(mb_.positions ? mb_.positions : nullptr, mb_.positions ? mb_.positions + N : nullptr);
    if (!mb_.positions) {
      pos.resize(size_t(N));
      for (int i = 0; i < N; i++) pos[size_t(i)] = i % T;
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
    hooks->add_row_grads(emb, {UnitHooks::RowGrads{m_.wte_, mb_.tokens, rows, N, C},
                               UnitHooks::RowGrads{m_.wpe_, pos.data(), rows, N, C}});
  } else {
    acquire(emb, true);
    if (!tp_.active()) {
      ops::encoder_bwd(g(m_.wte_), g(m_.wpe_), p(dx), tokens, positions, B, T, C, c_);
    } else {
      const int Vl = m_.cfg_.padded_vocab() / P_;
      ops::embedding_bwd(g(m_.wte_), gathered(ws.dx_all, p(dx)), tokens, tp_.rank() * Vl, Vl, N, C, c_);
      ops::embedding_bwd(g(m_.wpe_), p(dx), own_pos, 0, m_.cfg_.block_size, Ns, C, c_);
    }
    m_.release(emb);
    m_.grads_ready(emb);
  }
  const double loss_sum = sum_losses(losses);  // waits for the whole backward on a device
  m_.times_.backward += std::chrono::duration<double>(clock::now() - t_forward).count();
  return loss_sum;
}

double GPT::forward_backward(const MicroBatch& mb, float dloss) { return run(mb, dloss, Mode::train, nullptr); }
double GPT::forward_loss(const MicroBatch& mb) { return run(mb, 0.f, Mode::eval, nullptr); }
void GPT::forward_last_logits(const MicroBatch& mb, float* logits) { run(mb, 0.f, Mode::last_logits, logits); }

double GPT::run(const MicroBatch& mb, float dloss, Mode mode, float* last_logits) {
  MT_CHECK(arena_ != nullptr, "GPT::run without an arena (call set_arena)");
  MT_CHECK(store_.finalized(), "GPT::run before the ParamStore is finalized");
  check_batch(mb);
  if (mode != Mode::last_logits) MT_CHECK(mb.targets != nullptr, "loss requested without targets");
  const DType t = store_.compute_dtype();
  acquired_.assign(size_t(store_.num_units()), 0);
  switch (t) {
    case DType::f32: return Pass<float>(*this, mb).run(dloss, mode, last_logits);
    case DType::bf16: return Pass<bf16>(*this, mb).run(dloss, mode, last_logits);
    case DType::f16: return Pass<f16>(*this, mb).run(dloss, mode, last_logits);
    default: fail("the model cannot compute in %s (expected f32, bf16 or f16)", dtype_name(t));
  }
}

}  // namespace mt::model
