// GPT layers and classifier, forward and backward, in the run's storage type S (float, bf16 or f16; runtime/storage.h).
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

#include "model/gpt_pass.h"
#include "runtime/check.h"

namespace mt::model {

namespace {
// Rows of the classifier processed at once, which bounds the (rows, Vl) logits buffer. Every chunk
// streams the whole of wte through its forward and input-gradient GEMMs and reads and writes the fp32
// (Vl, C) wte gradient (155 MiB each for GPT-2), none of which any cache holds, so a chunk's rows
// should be as many as the logits budget allows: chunks are split evenly under it, never below
// kMinClassifierRows. On the 2-core CPU, GPT-2 B=4 T=256 ran 2-6% faster in one chunk than in four
// 256-row ones (docs/perf.md, issue 32's fourth pass); a 256 MiB budget gives it one chunk, and 7
// instead of 32 at B=8 T=1024. A GPU takes 1 GiB (8192 rows of GPT-2 in bf16).
constexpr int kMinClassifierRows = 256;
constexpr size_t kCpuLogitsBytes = size_t(256) << 20;
constexpr size_t kDeviceLogitsBytes = size_t(1) << 30;
}  // namespace

int classifier_rows(Device device, int N, int Vl, size_t elem_bytes) {
  if (N <= 0) return 0;
  const size_t budget = device == Device::cuda ? kDeviceLogitsBytes : kCpuLogitsBytes;
  const int most = int(std::max<size_t>(kMinClassifierRows, budget / (size_t(std::max(Vl, 1)) * elem_bytes)));
  const int chunks = (N + most - 1) / most;
  return (N + chunks - 1) / chunks;
}

template <class S>
void Pass<S>::alloc_layer(LayerActs& a, bool with_att, bool dense_mlp) {
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
  if (!dense_mlp) return;
  a.fch = act(4 * NCl);
  a.fch_gelu = act(4 * NCl);
}

template <class S>
void Pass<S>::layer_forward(int l, const S* x, S* x_next, LayerActs& a, Workspace& ws, const int32_t* doc) {
  const LayerParams& lp = m_.layers_[size_t(l)];
  const int C = C_, N = N_, Ns = Ns_, Cl = Cl_, F = 4 * C_ / P_;
  ops::layernorm_fwd(p(a.ln1), a.ln1_mean.f32(), a.ln1_rstd.f32(), x, w(lp.ln1_w), w(lp.ln1_b), Ns, C, c_);
  const S* ln1 = gathered(ws.ln_all, p(a.ln1));
  ops::matmul_fwd(p(a.qkv), ln1, w(lp.qkv_w), w(lp.qkv_b), N, C, 3 * Cl, c_);
  if (cp_.active())  // the host's copy of the ids decides which blocks to skip (ring_attention.h)
    cp_.forward(p(a.atty), a.lse.f32(), p(a.qkv), doc, doc ? mb_.doc_ids : nullptr, B_, T_, Cl, NHl_, c_);
  else if (flash_) ops::flash_attention_fwd(p(a.atty), a.lse.f32(), p(a.qkv), doc, B_, T_, Cl, NHl_, c_);
  else ops::attention_fwd(p(a.atty), p(a.att), p(a.qkv), doc, B_, T_, Cl, NHl_, c_);
  ops::matmul_fwd(partial_out(ws, x_next), p(a.atty), w(lp.proj_w), bias_once(lp.proj_b), N, Cl, C, c_);
  sum_partial(x_next, ws);
  // res2 = x + attention branch, and its LayerNorm, in one pass.
  ops::residual_layernorm_fwd(p(a.res2), p(a.ln2), a.ln2_mean.f32(), a.ln2_rstd.f32(), x, x_next, w(lp.ln2_w),
                              w(lp.ln2_b), Ns, C, c_);
  if (m_.cfg_.is_moe_layer(l)) {
    moe_forward(l, x_next, a);  // on this rank's Ns rows, the mixture whole (no split over tp)
    return;
  }
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
void Pass<S>::layer_backward(int l, S* dx, const S* x, LayerActs& a, Workspace& ws, const int32_t* doc,
                             LayerGrads* defer) {
  const LayerParams& lp = m_.layers_[size_t(l)];
  const int C = C_, N = N_, Ns = Ns_, Cl = Cl_, F = 4 * C_ / P_;
  // zb1's B_input (defer): no weight gradient here. The gradients of the ops' outputs land in (or are
  // copied to) *defer for layer_weight_backward; the LayerNorm backward, which makes both kinds at
  // once, puts its weight gradients in a scratch buffer that nobody reads.
  auto gw = [&](int i) { return defer ? nullptr : g(i); };
  auto gwout = [&](int i, int64_t n) { return defer ? ops::GradOut() : gout(i, n); };
  float* ln_dw = defer ? ws.ln_scratch.f32() : nullptr;
  auto keep = [&](Buffer& to, const S* from, int64_t elems) {
    ar_.mem().move(to.data(), from, size_t(elems) * sizeof(S));
  };
  S* dfc = defer ? p(defer->d_fc) : p(ws.dfc);
  S* dln2 = defer ? p(defer->d_ln2) : p(ws.dln);
  S* dqkv = defer ? p(defer->d_qkv) : p(ws.dqkv);
  S* dln1 = defer ? p(defer->d_ln1) : p(ws.dln);
  // MLP: x_next = res2 + fcproj(gelu(fc(ln2(res2)))). The first backward applies GELU's derivative.
  const S* dx_all = dx;
  if (m_.cfg_.is_moe_layer(l)) {
    moe_backward(l, dx, dln2, a, defer ? &defer->moe : nullptr);
  } else {
    dx_all = gathered(ws.dx_all, dx);
    if (defer) keep(defer->d_mlp_out, dx_all, all_rows_elems());
    ops::matmul_bwd(dfc, gwout(lp.fcproj_w, int64_t(F) * C), gw(lp.fcproj_b), dx_all, p(a.fch_gelu), w(lp.fcproj_w), N,
                    F, C, c_, p(a.fch));
    column_parallel_bwd(dln2, gwout(lp.fc_w, int64_t(F) * C), gw(lp.fc_b), dfc, p(a.ln2), w(lp.fc_w), F, ws);
  }
  // dres2 = residual path (already in dx) + LayerNorm path, accumulated by the LayerNorm backward.
  ops::layernorm_bwd(dx, defer ? ln_dw : g(lp.ln2_w), defer ? ln_dw + C : g(lp.ln2_b), dln2, p(a.res2),
                     w(lp.ln2_w), a.ln2_mean.f32(), a.ln2_rstd.f32(), Ns, C, true, c_);
  // Attention: res2 = x + proj(attn(qkv(ln1(x))))
  dx_all = gathered(ws.dx_all, dx);
  if (defer) keep(defer->d_attn_out, dx_all, all_rows_elems());
  ops::matmul_bwd(p(ws.datty), gwout(lp.proj_w, int64_t(Cl) * C), gw(lp.proj_b), dx_all, p(a.atty), w(lp.proj_w), N,
                  Cl, C, c_);
  if (cp_.active()) {
    cp_.backward(dqkv, p(ws.datty), p(a.qkv), p(a.atty), a.lse.f32(), doc, doc ? mb_.doc_ids : nullptr, B_, T_, Cl,
                 NHl_, c_);
  } else if (flash_) {
    ops::flash_attention_bwd(dqkv, ws.att_scratch.f32(), p(ws.datty), p(a.qkv), p(a.atty), a.lse.f32(), doc, B_, T_,
                             Cl, NHl_, c_);
  } else {
    const S* att = p(a.att);
    if (!a.att) {  // selective recompute: rebuild the probabilities from the saved qkv (dln is free now)
      ops::attention_fwd(p(ws.dln), p(ws.att), p(a.qkv), doc, B_, T_, Cl, NHl_, c_);
      att = p(ws.att);
    }
    ops::attention_bwd(dqkv, ws.att_scratch.f32(), p(ws.datty), p(a.qkv), att, doc, B_, T_, Cl, NHl_, c_);
  }
  column_parallel_bwd(dln1, gwout(lp.qkv_w, int64_t(3) * Cl * C), gw(lp.qkv_b), dqkv, p(a.ln1), w(lp.qkv_w), 3 * Cl,
                      ws);
  ops::layernorm_bwd(dx, defer ? ln_dw : g(lp.ln1_w), defer ? ln_dw + C : g(lp.ln1_b), dln1, x, w(lp.ln1_w),
                     a.ln1_mean.f32(), a.ln1_rstd.f32(), Ns, C, true, c_);
}

// zb1's W of one layer: each GEMM's weight gradient from its saved input and its output's gradient
// (kept by layer_backward), each LayerNorm's from its input, statistics and output gradient (the
// LayerNorm backward also makes an input gradient, into scratch). The same kernels and operands as
// the unsplit backward, so the weight gradients are the same bits.
template <class S>
void Pass<S>::layer_weight_backward(int l, const S* x, const LayerActs& a, const LayerGrads& d, Workspace& ws) {
  const LayerParams& lp = m_.layers_[size_t(l)];
  const int C = C_, N = N_, Ns = Ns_, Cl = Cl_, F = 4 * C_ / P_;
  if (m_.cfg_.is_moe_layer(l)) {
    moe_weight_backward(l, a, d.moe);
  } else {
    ops::matmul_bwd(static_cast<S*>(nullptr), gout(lp.fcproj_w, int64_t(F) * C), g(lp.fcproj_b), p(d.d_mlp_out),
                    p(a.fch_gelu), w(lp.fcproj_w), N, F, C, c_);
    column_parallel_bwd(nullptr, gout(lp.fc_w, int64_t(F) * C), g(lp.fc_b), p(d.d_fc), p(a.ln2), w(lp.fc_w), F, ws);
  }
  ops::layernorm_bwd(p(ws.dln), g(lp.ln2_w), g(lp.ln2_b), p(d.d_ln2), p(a.res2), w(lp.ln2_w), a.ln2_mean.f32(),
                     a.ln2_rstd.f32(), Ns, C, false, c_);
  ops::matmul_bwd(static_cast<S*>(nullptr), gout(lp.proj_w, int64_t(Cl) * C), g(lp.proj_b), p(d.d_attn_out),
                  p(a.atty), w(lp.proj_w), N, Cl, C, c_);
  column_parallel_bwd(nullptr, gout(lp.qkv_w, int64_t(3) * Cl * C), g(lp.qkv_b), p(d.d_qkv), p(a.ln1), w(lp.qkv_w),
                      3 * Cl, ws);
  ops::layernorm_bwd(p(ws.dln), g(lp.ln1_w), g(lp.ln1_b), p(d.d_ln1), x, w(lp.ln1_w), a.ln1_mean.f32(),
                     a.ln1_rstd.f32(), Ns, C, false, c_);
}

template <class S>
void Pass<S>::column_parallel_bwd(S* dinp_own, ops::GradOut dw, float* db, const S* dout, const S* inp_own,
                                  const S* w, int OC, Workspace& ws) {
  const int N = N_, C = C_;
  if (!tp_.active()) {
    ops::matmul_bwd(dinp_own, dw, db, dout, inp_own, w, N, C, OC, c_);
    return;
  }
  parallel::Comm& tc = tp_.data_comm();
  const bool sp = tp_.splits_sequence();
  const DType t = dtype_of<S>();
  parallel::CommHandle gather, sum;
  if (sp && dw) gather = tc.all_gather_async(inp_own, p(ws.ln_all), size_t(Ns_) * C, t);
  if (dinp_own) {
    S* partial = partial_out(ws, dinp_own);
    ops::matmul_bwd(partial, nullptr, nullptr, dout, static_cast<const S*>(nullptr), w, N, C, OC, c_);
    if (sp)
      sum = tc.reduce_scatter_async(partial, dinp_own, size_t(Ns_) * C, t, parallel::ReduceOp::sum);
    else
      sum = tc.all_reduce_async(dinp_own, size_t(N) * C, t, parallel::ReduceOp::sum);
  }
  gather.wait();
  if (dw) ops::matmul_bwd(static_cast<S*>(nullptr), dw, db, dout, sp ? p(ws.ln_all) : inp_own, w, N, C, OC, c_);
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
      const auto t0 = std::chrono::steady_clock::now();
      // The first chunk of rows writes wte's gradient over (when it is the step's first contribution).
      ops::matmul_bwd(dlnf + int64_t(r0) * C, gout(m_.wte_, int64_t(Vl) * C), nullptr, p(logits),
                      lnf + int64_t(r0) * C, w(m_.wte_), n, C, Vl, c_);
      // Backward's work inside the forward (GPT::PhaseTimes): the forward's clock is running around it.
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      m_.times_.forward -= dt;
      m_.times_.backward += dt;
    }
  }
}

// The per-row losses come back to the host once per micro-batch, after its backward has been
// queued: on a device the step's one synchronisation, which the logged loss needs anyway.
template <class S>
double Pass<S>::sum_losses(const Buffer& losses) {
  const ops::Region region(c_, "loss");
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

// The members model/gpt_stage.cpp calls, for each storage type.
#define MT_PASS_LAYER_MEMBERS(S)                                                                                    \
  template void Pass<S>::alloc_layer(LayerActs&, bool, bool);                                                       \
  template void Pass<S>::layer_forward(int, const S*, S*, LayerActs&, Workspace&, const int32_t*);                \
  template void Pass<S>::layer_backward(int, S*, const S*, LayerActs&, Workspace&, const int32_t*, LayerGrads*);  \
  template void Pass<S>::layer_weight_backward(int, const S*, const LayerActs&, const LayerGrads&, Workspace&);    \
  template void Pass<S>::classifier(float*, const S*, S*, const int32_t*, float, bool);                           \
  template double Pass<S>::sum_losses(const Buffer&);                                                               \
  template void Pass<S>::last_logits(const S*, float*);
MT_PASS_LAYER_MEMBERS(float)
MT_PASS_LAYER_MEMBERS(bf16)
MT_PASS_LAYER_MEMBERS(f16)
#undef MT_PASS_LAYER_MEMBERS

}  // namespace mt::model
