// Dispatch of every op in ops.h to its backend by ctx.device, and the explicit instantiations for the
// three storage types.
#include "kernels/ops.h"

#include "kernels/clip_coefficient.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/op_timer.h"
#include "runtime/check.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mt::ops {
namespace {

// Brackets one op with the Ctx's timer, if it has one (kernels/op_timer.h).
class OpScope {
 public:
  OpScope(const Ctx& ctx, const char* op, double flops, double bytes)
      : timer_(ctx.timer), trace_(ctx.trace && ctx.trace->recording() ? ctx.trace : nullptr), lane_(ctx.trace_lane),
        op_(op) {
    if (timer_) timer_->begin(op, flops, bytes);
    if (trace_) begin_ = Trace::Clock::now();
  }
  ~OpScope() {
    try {
      if (trace_) trace_->add(op_, "op", lane_, begin_, Trace::Clock::now());
      if (timer_) timer_->end();
    } catch (...) {  // a failed mark loses a timing (or a span), not the op's result
    }
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpTimer* timer_;
  Trace* trace_;
  int lane_;
  const char* op_;
  Trace::Clock::time_point begin_;
};

}  // namespace

Regions::Regions(OpTimer* timer, Trace* trace, int lane)
    : timer_(timer), trace_(trace), lane_(lane), owner_(std::this_thread::get_id()) {}

void Regions::begin_region(const char* name) {
  if (std::this_thread::get_id() != owner_) return;
  const bool traced = trace_ && trace_->recording();
  open_.push_back(Open{name, traced, traced ? Trace::Clock::now() : Trace::Clock::time_point()});
  if (timer_) timer_->begin_region(name);
}

void Regions::end_region() {
  if (std::this_thread::get_id() != owner_) return;
  MT_CHECK(!open_.empty(), "regions: end_region() without begin_region()");
  const Open o = open_.back();
  open_.pop_back();
  if (timer_) timer_->end_region();
  if (o.traced) trace_->add(o.name, "host", lane_, o.begin, Trace::Clock::now());
}

namespace {

// Model FLOPs of causal attention over (B, NH, T) with head size hs: 2 products (Q K^T, P V) of
// T (T + 1) / 2 visible pairs each, 2 FLOPs per multiply-add; the backward has 4 such products.
double attention_flops(int B, int T, int C, int NH) {
  return 2.0 * B * NH * (double(T) * (T + 1) / 2) * 2.0 * (NH > 0 ? C / NH : 0);
}

}  // namespace

// Dispatches to the backend; a profiling run times the op and books its FLOPs and its least memory
// traffic in bytes (every input read once, every output written once; what the table of `minitrain
// bench profile_ops=1` sets against the device's peaks).
#ifdef MT_HAVE_CUDA
#define MT_DISPATCH_COST(flops, bytes, cpu_call, cuda_call)   \
  do {                                                        \
    const OpScope mt_op_scope_(ctx, __func__, flops, bytes);  \
    if (ctx.device == Device::cuda) return cuda_call;         \
    return cpu_call;                                          \
  } while (0)
#else
#define MT_DISPATCH_COST(flops, bytes, cpu_call, cuda_call)                                             \
  do {                                                                                                  \
    MT_CHECK(ctx.device == Device::cpu, "this build has no CUDA backend (configure with MT_CUDA=ON)"); \
    const OpScope mt_op_scope_(ctx, __func__, flops, bytes);                                            \
    return cpu_call;                                                                                    \
  } while (0)
#endif

template <class S>
void encoder_fwd(S* out, const int32_t* tokens, const int32_t* pos, const S* wte, const S* wpe, int B, int T, int C,
                 const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 3.0 * B * T * C * sizeof(S), cpu::encoder_fwd<S>(out, tokens, pos, wte, wpe, B, T, C),
              cuda::encoder_fwd<S>(out, tokens, pos, wte, wpe, B, T, C, ctx));
}

template <class S>
void encoder_bwd(float* dwte, float* dwpe, const S* dout, const int32_t* tokens, const int32_t* pos, int B, int T,
                 int C, const Ctx& ctx) {
  // dout once; the gradient rows it lands in depend on the tokens (at most B T of each table).
  MT_DISPATCH_COST(0.0, double(B) * T * C * sizeof(S), cpu::encoder_bwd<S>(dwte, dwpe, dout, tokens, pos, B, T, C),
              cuda::encoder_bwd<S>(dwte, dwpe, dout, tokens, pos, B, T, C, ctx));
}

template <class S>
void layernorm_fwd(S* out, float* mean, float* rstd, const S* inp, const S* weight, const S* bias, int N, int C,
                   const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 2.0 * N * C * sizeof(S), cpu::layernorm_fwd<S>(out, mean, rstd, inp, weight, bias, N, C),
              cuda::layernorm_fwd<S>(out, mean, rstd, inp, weight, bias, N, C, ctx));
}

template <class S>
void residual_layernorm_fwd(S* res, S* out, float* mean, float* rstd, const S* a, const S* b, const S* weight,
                            const S* bias, int N, int C, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 4.0 * N * C * sizeof(S),
                   cpu::residual_layernorm_fwd<S>(res, out, mean, rstd, a, b, weight, bias, N, C),
              cuda::residual_layernorm_fwd<S>(res, out, mean, rstd, a, b, weight, bias, N, C, ctx));
}

template <class S>
void layernorm_bwd(S* dinp, float* dweight, float* dbias, const S* dout, const S* inp, const S* weight,
                   const float* mean, const float* rstd, int N, int C, bool accumulate, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, (accumulate ? 4.0 : 3.0) * N * C * sizeof(S),
                   cpu::layernorm_bwd<S>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, accumulate),
              cuda::layernorm_bwd<S>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, accumulate, ctx));
}

template <class S>
void matmul_fwd(S* out, const S* inp, const S* weight, const S* bias, int N, int IC, int OC, const Ctx& ctx,
                S* pre_gelu, const S* residual) {
  MT_CHECK(!(pre_gelu && residual), "matmul_fwd: a residual cannot be added after the GELU epilogue");
  MT_CHECK(residual == nullptr || residual != out, "matmul_fwd: residual must not alias out");
  const double elems = double(N) * IC + double(IC) * OC + double(N) * OC * (pre_gelu || residual ? 2 : 1);
  MT_DISPATCH_COST(2.0 * N * IC * OC, elems * sizeof(S),
                   cpu::matmul_fwd<S>(out, inp, weight, bias, N, IC, OC, pre_gelu, residual),
                   cuda::matmul_fwd<S>(out, inp, weight, bias, N, IC, OC, ctx, pre_gelu, residual));
}

template <class S>
void matmul_bwd(S* dinp, GradOut dweight, float* dbias, const S* dout, const S* inp, const S* weight, int N, int IC,
                int OC, const Ctx& ctx, const S* pre_gelu) {
  // dout; for dweight inp and the fp32 gradient (written, and read unless assigned); for dinp the
  // weight, dinp and the GELU input.
  const double bytes = (double(N) * OC + (dweight ? double(N) * IC : 0.0) +
                        (dinp ? double(IC) * OC + double(N) * IC * (pre_gelu ? 2 : 1) : 0.0)) * sizeof(S) +
                       (dweight ? (dweight.assign ? 4.0 : 8.0) * IC * OC : 0.0);
  MT_DISPATCH_COST(((dinp ? 2.0 : 0.0) + (dweight ? 2.0 : 0.0)) * N * IC * OC, bytes,
                   cpu::matmul_bwd<S>(dinp, dweight.p, dbias, dout, inp, weight, N, IC, OC, pre_gelu, dweight.assign),
              cuda::matmul_bwd<S>(dinp, dweight.p, dbias, dout, inp, weight, N, IC, OC, ctx, pre_gelu, dweight.assign));
}

template <class S>
void gelu_fwd(S* out, const S* inp, int64_t N, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 2.0 * N * sizeof(S), cpu::gelu_fwd<S>(out, inp, N), cuda::gelu_fwd<S>(out, inp, N, ctx));
}

template <class S>
void gelu_bwd(S* dinp, const S* dout, const S* inp, int64_t N, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 3.0 * N * sizeof(S), cpu::gelu_bwd<S>(dinp, dout, inp, N),
                   cuda::gelu_bwd<S>(dinp, dout, inp, N, ctx));
}

template <class S>
void attention_fwd(S* out, S* att, const S* qkv, const int32_t* doc, int B, int T, int C, int NH, const Ctx& ctx) {
  // qkv, out and the (B, NH, T, T) probabilities.
  const double bytes = (4.0 * B * T * C + double(B) * NH * T * T) * sizeof(S);
  MT_DISPATCH_COST(attention_flops(B, T, C, NH), bytes, cpu::attention_fwd<S>(out, att, qkv, doc, B, T, C, NH),
              cuda::attention_fwd<S>(out, att, qkv, doc, B, T, C, NH, ctx));
}

template <class S>
void attention_bwd(S* dqkv, float* scratch, const S* dout, const S* qkv, const S* att, const int32_t* doc, int B,
                   int T, int C, int NH, const Ctx& ctx) {
  const double bytes = (7.0 * B * T * C + double(B) * NH * T * T) * sizeof(S);  // qkv, dout, dqkv, probabilities
  MT_DISPATCH_COST(2 * attention_flops(B, T, C, NH), bytes,
                   cpu::attention_bwd<S>(dqkv, scratch, dout, qkv, att, doc, B, T, C, NH),
              cuda::attention_bwd<S>(dqkv, scratch, dout, qkv, att, doc, B, T, C, NH, ctx));
}

template <class S>
void flash_attention_fwd(S* out, float* lse, const S* qkv, const int32_t* doc, int B, int T, int C, int NH,
                         const Ctx& ctx) {
  const double bytes = 4.0 * B * T * C * sizeof(S) + 4.0 * B * NH * T;  // qkv, out, lse
  MT_DISPATCH_COST(attention_flops(B, T, C, NH), bytes, cpu::flash_attention_fwd<S>(out, lse, qkv, doc, B, T, C, NH),
              cuda::flash_attention_fwd<S>(out, lse, qkv, doc, B, T, C, NH, ctx));
}

template <class S>
void flash_attention_bwd(S* dqkv, float* scratch, const S* dout, const S* qkv, const S* out, const float* lse,
                         const int32_t* doc, int B, int T, int C, int NH, const Ctx& ctx) {
  const double bytes = 8.0 * B * T * C * sizeof(S) + 4.0 * B * NH * T;  // qkv, out, dout, dqkv, lse
  MT_DISPATCH_COST(2 * attention_flops(B, T, C, NH), bytes,
                   cpu::flash_attention_bwd<S>(dqkv, scratch, dout, qkv, out, lse, doc, B, T, C, NH),
              cuda::flash_attention_bwd<S>(dqkv, scratch, dout, qkv, out, lse, doc, B, T, C, NH, ctx));
}

template <class S>
void add(S* out, const S* a, const S* b, int64_t N, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 3.0 * N * sizeof(S), cpu::add<S>(out, a, b, N), cuda::add<S>(out, a, b, N, ctx));
}

template <class S>
void softmax_xent(float* losses, S* dlogits, const S* logits, const int32_t* targets, float dloss, int N, int V,
                  int Vp, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, double(N) * Vp * sizeof(S) * (dlogits ? 2 : 1),
                   cpu::softmax_xent<S>(losses, dlogits, logits, targets, dloss, N, V, Vp),
              cuda::softmax_xent<S>(losses, dlogits, logits, targets, dloss, N, V, Vp, ctx));
}

template <class S>
void embedding_fwd(S* out, const int32_t* ids, const S* table, int row0, int rows, int N, int C, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 2.0 * N * C * sizeof(S), cpu::embedding_fwd<S>(out, ids, table, row0, rows, N, C),
                   cuda::embedding_fwd<S>(out, ids, table, row0, rows, N, C, ctx));
}

template <class S>
void embedding_bwd(float* dtable, const S* dout, const int32_t* ids, int row0, int rows, int N, int C,
                   const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, double(N) * C * sizeof(S), cpu::embedding_bwd<S>(dtable, dout, ids, row0, rows, N, C),
                   cuda::embedding_bwd<S>(dtable, dout, ids, row0, rows, N, C, ctx));
}

template <class S>
void xent_slice_stats(float* stats, const S* logits, const int32_t* targets, int col0, int N, int V, int Vl,
                      const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, double(N) * Vl * sizeof(S), cpu::xent_slice_stats<S>(stats, logits, targets, col0, N, V, Vl),
                   cuda::xent_slice_stats<S>(stats, logits, targets, col0, N, V, Vl, ctx));
}

template <class S>
void xent_slice_finish(float* losses, S* dlogits, const S* logits, const float* stats, int P,
                       const int32_t* targets, float dloss, int col0, int N, int V, int Vl, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, double(N) * Vl * sizeof(S) * (dlogits ? 2 : 1),
                   cpu::xent_slice_finish<S>(losses, dlogits, logits, stats, P, targets, dloss, col0, N, V, Vl),
                   cuda::xent_slice_finish<S>(losses, dlogits, logits, stats, P, targets, dloss, col0, N, V, Vl,
                                               ctx));
}

template <class D, class S>
void convert(D* out, const S* in, int64_t N, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, double(N) * (sizeof(D) + sizeof(S)), (cpu::convert<D, S>(out, in, N)),
                   (cuda::convert<D, S>(out, in, N, ctx)));
}

// Ring attention's block kernels: the FLOPs booked are those of every (query, key) pair of the block
// (the masked ones included). attention_block_hidden reads host arrays on either backend.
bool attention_block_hidden(const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc,
                            int B, int Tq, int Tk) {
  return cpu::attention_block_hidden(q_pos, k_pos, q_doc, k_doc, B, Tq, Tk);
}

template <class S>
void flash_block_fwd(float* out, float* lse, const S* q, int ldq, const S* k, const S* v, int ldkv,
                     const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B,
                     int Tq, int Tk, int C, int NH, const Ctx& ctx) {
  const double flops = 4.0 * B * double(Tq) * Tk * C, bytes = (double(Tq) + 2.0 * Tk) * B * C * sizeof(S);
  MT_DISPATCH_COST(flops, bytes,
                   cpu::flash_block_fwd<S>(out, lse, q, ldq, k, v, ldkv, q_pos, k_pos, q_doc, k_doc, B, Tq, Tk, C, NH),
                   cuda::flash_block_fwd<S>(out, lse, q, ldq, k, v, ldkv, q_pos, k_pos, q_doc, k_doc, B, Tq, Tk, C, NH,
                                            ctx));
}

void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse, int B, int T, int C,
                     int NH, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 16.0 * B * T * C, cpu::attention_merge<float>(out, lse, part_out, part_lse, B, T, C, NH),
                   cuda::attention_merge(out, lse, part_out, part_lse, B, T, C, NH, ctx));
}

template <class S>
void attention_delta(float* delta, const S* dout, const S* out, int B, int T, int C, int NH, const Ctx& ctx) {
  MT_DISPATCH_COST(2.0 * B * T * C, 2.0 * B * T * C * sizeof(S), cpu::attention_delta<S>(delta, dout, out, B, T, C, NH),
                   cuda::attention_delta<S>(delta, dout, out, B, T, C, NH, ctx));
}

template <class S>
void flash_block_bwd(float* dq, float* dk, float* dv, int lddkv, const S* dout, const S* q, int ldq, const S* k,
                     const S* v, int ldkv, const float* lse, const float* delta, const int32_t* q_pos,
                     const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B, int Tq, int Tk, int C,
                     int NH, const Ctx& ctx) {
  const double flops = 10.0 * B * double(Tq) * Tk * C, bytes = (double(Tq) + 2.0 * Tk) * B * C * (sizeof(S) + 8.0);
  MT_DISPATCH_COST(flops, bytes,
                   cpu::flash_block_bwd<S>(dq, dk, dv, lddkv, dout, q, ldq, k, v, ldkv, lse, delta, q_pos, k_pos, q_doc,
                                           k_doc, B, Tq, Tk, C, NH),
                   cuda::flash_block_bwd<S>(dq, dk, dv, lddkv, dout, q, ldq, k, v, ldkv, lse, delta, q_pos, k_pos,
                                            q_doc, k_doc, B, Tq, Tk, C, NH, ctx));
}

template <class T>
void copy_columns(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t cols, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 2.0 * double(rows) * double(cols) * sizeof(T),
                   cpu::copy_columns<T>(dst, ld_dst, src, ld_src, rows, cols),
                   cuda::copy_columns<T>(dst, ld_dst, src, ld_src, rows, cols, ctx));
}

#define MT_BLOCK_OPS_INSTANTIATE(S)                                                                              \
  template void flash_block_fwd<S>(float*, float*, const S*, int, const S*, const S*, int, const int32_t*,       \
                                   const int32_t*, const int32_t*, const int32_t*, int, int, int, int, int,      \
                                   const Ctx&);                                                                  \
  template void attention_delta<S>(float*, const S*, const S*, int, int, int, int, const Ctx&);                 \
  template void flash_block_bwd<S>(float*, float*, float*, int, const S*, const S*, int, const S*, const S*, int, \
                                   const float*, const float*, const int32_t*, const int32_t*, const int32_t*,   \
                                   const int32_t*, int, int, int, int, int, const Ctx&);                         \
  template void copy_columns<S>(S*, int64_t, const S*, int64_t, int64_t, int64_t, const Ctx&);
MT_BLOCK_OPS_INSTANTIATE(float)
MT_BLOCK_OPS_INSTANTIATE(bf16)
MT_BLOCK_OPS_INSTANTIATE(f16)
#undef MT_BLOCK_OPS_INSTANTIATE

// Mixture of experts: data movement and the router's small per-token loops (no FLOPs booked).
void moe_route(float* probs, float* lse, double* lse_sq, int32_t* expert, float* gate, const float* logits,
               const float* bias, int N, int E, int K, const Ctx& ctx) {
  MT_CHECK(N >= 0 && E > 0 && K >= 1 && K <= E, "moe_route: N %d, E %d, K %d", N, E, K);
  MT_DISPATCH_COST(0.0, 12.0 * N * E + 16.0 * N * K,
                   cpu::moe_route(probs, lse, lse_sq, expert, gate, logits, bias, N, E, K),
                   cuda::moe_route(probs, lse, lse_sq, expert, gate, logits, bias, N, E, K, ctx));
}

void moe_route_stats(double* sums, const float* probs, const double* lse_sq, int N, int E, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 4.0 * N * E + 8.0 * N, cpu::moe_route_stats(sums, probs, lse_sq, N, E),
                   cuda::moe_route_stats(sums, probs, lse_sq, N, E, ctx));
}

void moe_route_bwd(float* dlogits, const float* dgate, const float* probs, const float* lse, const int32_t* expert,
                   const float* gate, const int32_t* load, int N, int E, int K, double aux_weight, double z_weight,
                   const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 8.0 * N * E + 12.0 * N * K,
                   cpu::moe_route_bwd(dlogits, dgate, probs, lse, expert, gate, load, N, E, K, aux_weight, z_weight),
                   cuda::moe_route_bwd(dlogits, dgate, probs, lse, expert, gate, load, N, E, K, aux_weight, z_weight,
                                       ctx));
}

void moe_plan(int32_t* load, int32_t* offset, int32_t* row_of, int32_t* assignment_of, const int32_t* expert, int N,
              int K, int E, int64_t capacity, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 16.0 * N * K, cpu::moe_plan(load, offset, row_of, assignment_of, expert, N, K, E, capacity),
                   cuda::moe_plan(load, offset, row_of, assignment_of, expert, N, K, E, capacity, ctx));
}

template <class S>
void moe_permute(S* out, const S* x, const int32_t* assignment_of, int64_t M, int K, int C, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 2.0 * M * C * sizeof(S), cpu::moe_permute<S>(out, x, assignment_of, M, K, C),
                   cuda::moe_permute<S>(out, x, assignment_of, M, K, C, ctx));
}

template <class S>
void moe_unpermute(S* out, const S* rows, const int32_t* row_of, int64_t A, int C, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 2.0 * A * C * sizeof(S), cpu::moe_unpermute<S>(out, rows, row_of, A, C),
                   cuda::moe_unpermute<S>(out, rows, row_of, A, C, ctx));
}

template <class S>
void moe_permute_bwd(S* dx, const S* drows, const float* extra, const int32_t* row_of, int N, int K, int C,
                     const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, (double(K) + 1) * N * C * sizeof(S), cpu::moe_permute_bwd<S>(dx, drows, extra, row_of, N, K, C),
                   cuda::moe_permute_bwd<S>(dx, drows, extra, row_of, N, K, C, ctx));
}

template <class S>
void moe_combine(S* y, const S* rows, const float* gate, const S* base, const int32_t* row_of, int N, int K, int C,
                 const Ctx& ctx) {
  MT_DISPATCH_COST(2.0 * N * K * C, (double(K) + 2) * N * C * sizeof(S),
                   cpu::moe_combine<S>(y, rows, gate, base, row_of, N, K, C),
                   cuda::moe_combine<S>(y, rows, gate, base, row_of, N, K, C, ctx));
}

template <class S>
void moe_combine_bwd(S* drows, float* dgate, const S* dy, const S* rows, const float* gate, const int32_t* row_of,
                     const int32_t* assignment_of, int64_t M, int N, int K, int C, const Ctx& ctx) {
  MT_DISPATCH_COST(3.0 * M * C, 3.0 * M * C * sizeof(S),
                   cpu::moe_combine_bwd<S>(drows, dgate, dy, rows, gate, row_of, N, K, C),
                   cuda::moe_combine_bwd<S>(drows, dgate, dy, rows, gate, row_of, assignment_of, M, N, K, C, ctx));
}

#define MT_MOE_OPS_INSTANTIATE(S)                                                                                 \
  template void moe_permute<S>(S*, const S*, const int32_t*, int64_t, int, int, const Ctx&);                      \
  template void moe_unpermute<S>(S*, const S*, const int32_t*, int64_t, int, const Ctx&);                         \
  template void moe_permute_bwd<S>(S*, const S*, const float*, const int32_t*, int, int, int, const Ctx&);        \
  template void moe_combine<S>(S*, const S*, const float*, const S*, const int32_t*, int, int, int, const Ctx&);  \
  template void moe_combine_bwd<S>(S*, float*, const S*, const S*, const float*, const int32_t*, const int32_t*,  \
                                   int64_t, int, int, int, const Ctx&);
MT_MOE_OPS_INSTANTIATE(float)
MT_MOE_OPS_INSTANTIATE(bf16)
MT_MOE_OPS_INSTANTIATE(f16)
#undef MT_MOE_OPS_INSTANTIATE

#define MT_OPS_INSTANTIATE(S)                                                                                     \
  template void encoder_fwd<S>(S*, const int32_t*, const int32_t*, const S*, const S*, int, int, int, const Ctx&); \
  template void encoder_bwd<S>(float*, float*, const S*, const int32_t*, const int32_t*, int, int, int,           \
                               const Ctx&);                                                                      \
  template void layernorm_fwd<S>(S*, float*, float*, const S*, const S*, const S*, int, int, const Ctx&);         \
  template void residual_layernorm_fwd<S>(S*, S*, float*, float*, const S*, const S*, const S*, const S*, int,    \
                                          int, const Ctx&);                                                      \
  template void layernorm_bwd<S>(S*, float*, float*, const S*, const S*, const S*, const float*, const float*,    \
                                 int, int, bool, const Ctx&);                                                    \
  template void matmul_fwd<S>(S*, const S*, const S*, const S*, int, int, int, const Ctx&, S*, const S*);                   \
  template void matmul_bwd<S>(S*, GradOut, float*, const S*, const S*, const S*, int, int, int, const Ctx&,        \
                              const S*);                                                                         \
  template void gelu_fwd<S>(S*, const S*, int64_t, const Ctx&);                                                   \
  template void gelu_bwd<S>(S*, const S*, const S*, int64_t, const Ctx&);                                         \
  template void attention_fwd<S>(S*, S*, const S*, const int32_t*, int, int, int, int, const Ctx&);               \
  template void attention_bwd<S>(S*, float*, const S*, const S*, const S*, const int32_t*, int, int, int, int,    \
                                 const Ctx&);                                                                    \
  template void flash_attention_fwd<S>(S*, float*, const S*, const int32_t*, int, int, int, int, const Ctx&);     \
  template void flash_attention_bwd<S>(S*, float*, const S*, const S*, const S*, const float*, const int32_t*,    \
                                       int, int, int, int, const Ctx&);                                          \
  template void add<S>(S*, const S*, const S*, int64_t, const Ctx&);                                              \
  template void softmax_xent<S>(float*, S*, const S*, const int32_t*, float, int, int, int, const Ctx&);          \
  template void convert<S, float>(S*, const float*, int64_t, const Ctx&);                                       \
  template void embedding_fwd<S>(S*, const int32_t*, const S*, int, int, int, int, const Ctx&);                  \
  template void embedding_bwd<S>(float*, const S*, const int32_t*, int, int, int, int, const Ctx&);              \
  template void xent_slice_stats<S>(float*, const S*, const int32_t*, int, int, int, int, const Ctx&);           \
  template void xent_slice_finish<S>(float*, S*, const S*, const float*, int, const int32_t*, float, int, int,   \
                                     int, int, const Ctx&);
MT_OPS_INSTANTIATE(float)
MT_OPS_INSTANTIATE(bf16)
MT_OPS_INSTANTIATE(f16)
#undef MT_OPS_INSTANTIATE
template void convert<float, bf16>(float*, const bf16*, int64_t, const Ctx&);
template void convert<float, f16>(float*, const f16*, int64_t, const Ctx&);

void adamw(float* params, float* m, float* v, const float* grads, int64_t N, float lr, float beta1, float beta2,
           float eps, float weight_decay, int t, const Ctx& ctx, const float* grad_scale) {
  MT_DISPATCH_COST(0.0, 28.0 * N,  // params, m, v read and written; grads read
                   cpu::adamw<float>(params, m, v, grads, N, lr, beta1, beta2, eps, weight_decay, t, grad_scale),
              cuda::adamw(params, m, v, grads, N, lr, beta1, beta2, eps, weight_decay, t, ctx, grad_scale));
}

double sum_squares(const float* x, int64_t N, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 4.0 * N, cpu::sum_squares<float>(x, N), cuda::sum_squares(x, N, ctx));
}

void sum_squares_into(double* out, const float* x, int64_t N, bool accumulate, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 4.0 * N, void(*out = (accumulate ? *out : 0.0) + cpu::sum_squares<float>(x, N)),
              cuda::sum_squares_into(out, x, N, accumulate, ctx));
}

void clip_coefficient(float* coef, const double* sum_sq, double inv_scale, double max_norm, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 0.0, void(*coef = ops::clip_coefficient(*sum_sq, inv_scale, max_norm)),
              cuda::clip_coefficient(coef, sum_sq, inv_scale, max_norm, ctx));
}

void scale(float* x, float s, int64_t N, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 8.0 * N, cpu::scale<float>(x, s, N), cuda::scale(x, s, N, ctx));
}

void round_to(float* x, int64_t N, DType t, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 8.0 * N, cpu::round_to(x, N, int(t)), cuda::round_to(x, N, t, ctx));
}

bool all_finite(const float* x, int64_t N, const Ctx& ctx) {
  MT_DISPATCH_COST(0.0, 4.0 * N, cpu::all_finite(x, N), cuda::all_finite(x, N, ctx));
}

}  // namespace mt::ops
