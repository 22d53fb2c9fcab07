// The op interface: forward AND backward of every op the model uses. One signature, two backends:
// kernels/cpu/ (the reference) and kernels/cuda/ (the fast path). The model calls only these
// functions; `ctx.device` picks the backend.
//
// Conventions (as in llm.c):
//  - argument order: outputs, inputs, sizes, then the context;
//  - all tensors are row-major. Activations, activation gradients and compute weights have the
//    storage type S of the run: float, bf16 or f16 (runtime/storage.h), instantiated for all three.
//    Kernels load S into fp32, compute in fp32 and round once on store. Parameter gradients, LayerNorm
//    statistics, losses and the optimizer state are always fp32 (`float*` below);
//  - parameter gradients ACCUMULATE (+=), except a weight gradient given as an assigned GradOut (the
//    step's first contribution, written over); activation gradients are ASSIGNED (=) unless a flag
//    says so;
//  - shapes in comments: B batch, T time, C channels, NH heads, hs = C/NH, V vocab, Vp padded vocab,
//    N rows (= B*T), IC/OC in/out features;
//  - CPU results are bitwise deterministic for a fixed thread count; so are CUDA results for a
//    fixed device and shape (no floating-point atomics).
#pragma once
#include <cstdint>
#include <thread>
#include <vector>

#include "runtime/device_wait.h"
#include "runtime/dtype.h"
#include "runtime/regions.h"
#include "runtime/storage.h"
#include "runtime/tensor.h"
#include "runtime/trace.h"

namespace mt::ops {

class OpTimer;  // kernels/op_timer.h

// Where a parameter gradient goes: added to p (+=), as parameter gradients are, or, with assign,
// written over it without reading it: the step's first contribution to a buffer whose old contents
// are stale (ParamStore::grad_for_write), so nothing had to zero it first. The same bits either way:
// a product summed from +0 is never -0, so 0 + x and x agree.
struct GradOut {
  float* p = nullptr;
  bool assign = false;
  GradOut() = default;
  GradOut(float* to, bool assign_ = false) : p(to), assign(assign_) {}  // NOLINT: a float* accumulates
  explicit operator bool() const { return p != nullptr; }
};

struct Ctx {
  Device device = Device::cpu;
  void* stream = nullptr;    // cudaStream_t on the CUDA backend
  OpTimer* timer = nullptr;  // profiling runs: every op is timed (kernels/op_timer.h)
  Trace* trace = nullptr;    // trace=1 runs: every op is a span on lane trace_lane while recording
  int trace_lane = 0;
  // How the host waits for this stream's work (an op that returns a value: sum_squares, all_finite):
  // nullptr blocks; the trainer's polls under dist.timeout (runtime/device_wait.h).
  const DeviceWait* wait = nullptr;
  // Profiling and traced runs: where host work between ops is named (runtime/regions.h; ops::Regions).
  RegionSink* regions = nullptr;
};

// A timer and a trace as a RegionSink: each region the step names becomes a row of the op profile
// (its own time; kernels/op_timer.h) and, while the trace records, a span on `lane`. Either may be
// null. Only the thread that made it is heard (a checkpoint writer allocating from the same arena is
// not a region of the step).
class Regions final : public RegionSink {
 public:
  Regions(OpTimer* timer, Trace* trace, int lane);
  void begin_region(const char* name) override;
  void end_region() override;

 private:
  struct Open {
    const char* name;
    bool traced;
    Trace::Clock::time_point begin;
  };
  OpTimer* timer_;
  Trace* trace_;
  int lane_;
  std::thread::id owner_;
  std::vector<Open> open_;
};

// The region a mixture layer's expert-parallel exchanges are booked to (the bench reads it per rank).
inline constexpr const char* kEpExchange = "ep exchange";

// One region of the Ctx's sink (if any) over a scope: ops::Region r(ctx, "loss").
class Region : public RegionScope {
 public:
  Region(const Ctx& ctx, const char* name) : RegionScope(ctx.regions, name) {}
};

// out[b,t,:] = wte[tokens[b,t],:] + wpe[pos[b,t],:]; pos == nullptr means pos[b,t] = t.
// out (B,T,C), tokens/pos (B,T), wte (V,C), wpe (maxT,C).
template <class S>
void encoder_fwd(S* out, const int32_t* tokens, const int32_t* pos, const S* wte, const S* wpe, int B, int T, int C,
                 const Ctx& ctx);
// dwte += scatter(dout), dwpe += scatter(dout)
template <class S>
void encoder_bwd(float* dwte, float* dwpe, const S* dout, const int32_t* tokens, const int32_t* pos, int B, int T,
                 int C, const Ctx& ctx);

// LayerNorm over the last dim, eps = 1e-5. out (N,C); mean, rstd (N) saved for backward.
template <class S>
void layernorm_fwd(S* out, float* mean, float* rstd, const S* inp, const S* weight, const S* bias, int N, int C,
                   const Ctx& ctx);
// The residual add fused with the LayerNorm that follows it: res = a + b (rounded to S), then
// out = layernorm(res). res may alias a or b. Same results as add then layernorm_fwd.
template <class S>
void residual_layernorm_fwd(S* res, S* out, float* mean, float* rstd, const S* a, const S* b, const S* weight,
                            const S* bias, int N, int C, const Ctx& ctx);
// dinp = (accumulate ? dinp : 0) + dLayerNorm, rounded once; dweight += ..., dbias += ...
// (accumulate = true fuses the residual path's gradient into the LayerNorm backward).
template <class S>
void layernorm_bwd(S* dinp, float* dweight, float* dbias, const S* dout, const S* inp, const S* weight,
                   const float* mean, const float* rstd, int N, int C, bool accumulate, const Ctx& ctx);

// out (N,OC) = inp (N,IC) @ weight (OC,IC)^T + bias (OC); bias may be nullptr.
// If pre_gelu != nullptr, GELU is fused as an epilogue: pre_gelu = inp @ weight^T + bias (rounded)
// and out = gelu(that value before rounding), as one GEMM with a GELU_AUX epilogue does.
// If residual != nullptr (N,OC; not with pre_gelu, not aliasing out), out = inp @ weight^T + bias +
// residual, rounded once: a residual connection added by the GEMM itself (its C, beta = 1).
template <class S>
void matmul_fwd(S* out, const S* inp, const S* weight, const S* bias, int N, int IC, int OC, const Ctx& ctx,
                S* pre_gelu = nullptr, const S* residual = nullptr);
// dinp = dout @ weight (skipped if dinp == nullptr); dweight += dout^T @ inp (skipped if dweight ==
// nullptr; inp is then not read; = with dweight.assign, all IC x OC elements); dbias += colsum(dout)
// (skipped if dbias == nullptr). Called once
// with only dinp and once with only dweight/dbias, the results are those of one call, bit for bit
// (tensor parallelism does so to overlap a collective with the second GEMM). If pre_gelu != nullptr (the pre-activation of the layer that
// produced inp), dinp = gelu'(pre_gelu) * (dout @ weight), rounded once: the backward of GELU fused.
template <class S>
void matmul_bwd(S* dinp, GradOut dweight, float* dbias, const S* dout, const S* inp, const S* weight, int N, int IC,
                int OC, const Ctx& ctx, const S* pre_gelu = nullptr);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class S>
void gelu_fwd(S* out, const S* inp, int64_t N, const Ctx& ctx);
template <class S>
void gelu_bwd(S* dinp, const S* dout, const S* inp, int64_t N, const Ctx& ctx);

// Causal self-attention. qkv (B,T,3C) holds [q | k | v], each (NH, hs) per token; out (B,T,C).
// doc (B,T) may be nullptr; if given, token i attends to j iff j <= i and doc[i] == doc[j] (packed
// documents do not see each other). Scores are scaled by 1/sqrt(hs).
//
// The materialised path: att (B,NH,T,T) receives the softmax probabilities (rounded to S; entries a
// token may not attend to are 0), saved for backward.
template <class S>
void attention_fwd(S* out, S* att, const S* qkv, const int32_t* doc, int B, int T, int C, int NH, const Ctx& ctx);
// dqkv (B,T,3C) = ...; scratch (B,NH,T,T) fp32 workspace for the CUDA backend (the CPU one keeps
// dS a block of query rows at a time and takes none: scratch may be null there).
template <class S>
void attention_bwd(S* dqkv, float* scratch, const S* dout, const S* qkv, const S* att, const int32_t* doc, int B,
                   int T, int C, int NH, const Ctx& ctx);
// The flash path (Dao et al. 2022, FlashAttention-2's loop order): keys and values in blocks with an
// online softmax, no T x T buffer. lse (B,NH,T) receives each query's log-sum-exp of its scaled,
// masked scores, saved for backward. In fp32 the same result as attention_fwd up to summation order;
// in bf16/f16 P stays fp32 here (the materialised path stores it in S), a difference of about one
// rounding of P.
template <class S>
void flash_attention_fwd(S* out, float* lse, const S* qkv, const int32_t* doc, int B, int T, int C, int NH,
                         const Ctx& ctx);
// dqkv (B,T,3C) from dout, the forward's qkv, out and lse; P is recomputed block by block.
// scratch (B,NH,T) fp32 workspace (rowsum(dout * out) per query).
template <class S>
void flash_attention_bwd(S* dqkv, float* scratch, const S* dout, const S* qkv, const S* out, const float* lse,
                         const int32_t* doc, int B, int T, int C, int NH, const Ctx& ctx);

// Block attention (ring attention, parallel/ring_attention.h): a query block (B,Tq) meets a key/value
// block (B,Tk); each row carries its global position in the sequence (q_pos (Tq), k_pos (Tk), the same
// for every batch row) and, optionally, its document id (q_doc (B,Tq), k_doc (B,Tk): both or neither).
// Key j is visible to query i iff k_pos[j] <= q_pos[i] and the document ids are equal. q and k, v are
// head-major rows of stride ldq and ldkv (head h at column h hs): q may be the Q part of a (B,T,3C)
// qkv (ldq = 3C), k and v a travelling (B,T,2C) block. Both backends: on CUDA (kernels/cuda/flash_block.cu,
// proven on the warp emulator) positions and ids are device arrays, and ring attention keeps host
// copies of them for attention_block_hidden (its document ids travel the host ring beside the blocks).
//
// True when no query of the block can see any key of the other in any batch row (exact, by positions
// and document ids, O(Tq + Tk) per row): ring attention skips the pair. Host arrays.
bool attention_block_hidden(const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc,
                            int B, int Tq, int Tk);
// out (B,Tq,C) fp32 = the attention of the queries over this block's visible keys, normalised by the
// block's own sum; lse (B,NH,Tq) its log-sum-exp. A query with no visible key: out 0, lse -inf.
template <class S>
void flash_block_fwd(float* out, float* lse, const S* q, int ldq, const S* k, const S* v, int ldkv,
                     const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B,
                     int Tq, int Tk, int C, int NH, const Ctx& ctx);
// (out, lse) = the merge of (out, lse) and (part_out, part_lse) in fp32: with L = log(e^lse + e^part),
// out = e^(lse - L) out + e^(part - L) part_out. A side with lse -inf contributes nothing.
void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse, int B, int T, int C,
                     int NH, const Ctx& ctx);
// delta (B,NH,T) = rowsum(dout * out) per head: FlashAttention-2's D, from the final output.
template <class S>
void attention_delta(float* delta, const S* dout, const S* out, int B, int T, int C, int NH, const Ctx& ctx);
// Backward of one block pair with the FINAL lse and delta of the queries: dq (B,Tq,C) += ...,
// dk, dv (B,Tk, row stride lddkv) += ..., all fp32 (ACCUMULATED over the pairs a rank computes).
template <class S>
void flash_block_bwd(float* dq, float* dk, float* dv, int lddkv, const S* dout, const S* q, int ldq, const S* k,
                     const S* v, int ldkv, const float* lse, const float* delta, const int32_t* q_pos,
                     const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B, int Tq, int Tk, int C,
                     int NH, const Ctx& ctx);
// dst[r, 0:cols] = src[r, 0:cols] for rows r < rows, the rows ld_dst and ld_src elements apart: a column
// slice between row-major arrays (ring attention's key/value block out of qkv, dqkv put together from
// its parts). T: float, bf16 or f16.
template <class T>
void copy_columns(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t cols, const Ctx& ctx);

// out = a + b (out may alias a or b).
template <class S>
void add(S* out, const S* a, const S* b, int64_t N, const Ctx& ctx);

// Fused softmax + cross-entropy over a padded vocabulary. logits (N,Vp), only the first V columns
// are real. losses[i] = -log softmax(logits[i,:V])[targets[i]], or 0 where targets[i] < 0 (ignored).
// If dlogits != nullptr: dlogits[i,:V] = dloss * (softmax - onehot(targets[i])), 0 in padded columns
// and in ignored rows. dlogits may alias logits (in-place backward).
template <class S>
void softmax_xent(float* losses, S* dlogits, const S* logits, const int32_t* targets, float dloss, int N, int V,
                  int Vp, const Ctx& ctx);

// Vocabulary parallelism (parallel/tensor_parallel.h). A rank holds rows [row0, row0 + rows) of an
// embedding table split by rows; an id outside them contributes nothing:
// out[i,:] = table[ids[i] - row0,:] for an id in range, else 0. out (N,C), table (rows,C).
// The CPU backend only, so far.
template <class S>
void embedding_fwd(S* out, const int32_t* ids, const S* table, int row0, int rows, int N, int C, const Ctx& ctx);
// dtable[ids[i] - row0,:] += dout[i,:] for the ids in range (rows in order: deterministic).
template <class S>
void embedding_bwd(float* dtable, const S* dout, const int32_t* ids, int row0, int rows, int N, int C,
                   const Ctx& ctx);
// Softmax cross-entropy over logits split by columns: logits (N,Vl) are columns [col0, col0 + Vl) of
// a padded vocabulary whose first V columns are real. stats (N,3) receives per row this slice's max m
// over its real columns, the sum of exp(x - m) over them, and the target's logit if the target lies
// in the slice (else 0); m = -inf and sum 0 where the slice has no real column or the row is ignored.
template <class S>
void xent_slice_stats(float* stats, const S* logits, const int32_t* targets, int col0, int N, int V, int Vl,
                      const Ctx& ctx);
// With all P slices' stats (P,N,3) in rank order: losses as softmax_xent defines them (the partials
// merged as log-sum-exp in rank order, so every rank gets the same losses), and if dlogits != nullptr
// this slice's dlogits = dloss (softmax - onehot), 0 in padded columns and ignored rows (may alias
// logits). With P = 1 and col0 = 0 the results are softmax_xent's, bit for bit.
template <class S>
void xent_slice_finish(float* losses, S* dlogits, const S* logits, const float* stats, int P,
                       const int32_t* targets, float dloss, int col0, int N, int V, int Vl, const Ctx& ctx);

// Mixture of experts (moe/; the CPU twins in kernels/cpu/moe.cpp, the kernels in kernels/cuda/moe.cu).
// N tokens, E experts, K choices per token; assignment a = t K + j is token t's j-th choice; M rows
// kept (the permuted rows, expert by expert). Every array lives in the memory of ctx's device.
//
// The router on fp32 logits (N,E): probs (N,E) = softmax; lse (N) its log-sum-exp (fp32) and lse_sq
// (N) that log-sum-exp squared in double (the z-loss's sum); expert (N,K) the K largest scores
// p_i + bias_i (bias (E) or nullptr), best first, ties to the lower index; gate (N,K) the chosen
// probabilities renormalised to sum to one (K > 1) or p itself (K = 1). moe/router.h has the model.
void moe_route(float* probs, float* lse, double* lse_sq, int32_t* expert, float* gate, const float* logits,
               const float* bias, int N, int E, int K, const Ctx& ctx);
// sums (E+1, double): sum over tokens of probs[:, i], then the sum of lse_sq (moe::route_summary).
void moe_route_stats(double* sums, const float* probs, const double* lse_sq, int N, int E, const Ctx& ctx);
// dlogits (N,E) assigned: the gradient of sum dgate-weighted gates + aux_weight A + z_weight Z (the
// balance loss over load (E) assignments per expert, and the z-loss); see moe::route_backward.
void moe_route_bwd(float* dlogits, const float* dgate, const float* probs, const float* lse, const int32_t* expert,
                   const float* gate, const int32_t* load, int N, int E, int K, double aux_weight, double z_weight,
                   const Ctx& ctx);
// The dispatch plan of expert (N,K): load (E) assignments per expert, offset (E+1) first row of each
// expert's block (at most `capacity` rows each; capacity < 0: no limit), row_of (N K) each
// assignment's row or -1 when dropped, assignment_of (M) the assignment each row holds. Rows within an
// expert in increasing a (stable). moe/dispatch.h has the model.
void moe_plan(int32_t* load, int32_t* offset, int32_t* row_of, int32_t* assignment_of, const int32_t* expert, int N,
              int K, int E, int64_t capacity, const Ctx& ctx);
// out (M,C): row r = x[assignment_of[r] / K].
template <class S>
void moe_permute(S* out, const S* x, const int32_t* assignment_of, int64_t M, int K, int C, const Ctx& ctx);
// out (A,C): row a = rows[row_of[a]], zero where dropped.
template <class S>
void moe_unpermute(S* out, const S* rows, const int32_t* row_of, int64_t A, int C, const Ctx& ctx);
// dx (N,C) assigned: extra_t (fp32, nullptr: none) + the sum of drows over token t's kept rows in
// choice order, in fp32, rounded once.
template <class S>
void moe_permute_bwd(S* dx, const S* drows, const float* extra, const int32_t* row_of, int N, int K, int C,
                     const Ctx& ctx);
// y (N,C) assigned: base_t (nullptr: zero; may alias y) + sum over t's kept choices j of
// gate[t K + j] rows[row_of[t K + j]], in fp32 in choice order, rounded once.
template <class S>
void moe_combine(S* y, const S* rows, const float* gate, const S* base, const int32_t* row_of, int N, int K, int C,
                 const Ctx& ctx);
// drows (M,C) assigned: gate_a dy_t; dgate (N K) assigned: <dy_t, rows[row_of(a)]> summed in double in
// column order (0 if dropped). assignment_of (M) as moe_plan leaves it.
template <class S>
void moe_combine_bwd(S* drows, float* dgate, const S* dy, const S* rows, const float* gate, const int32_t* row_of,
                     const int32_t* assignment_of, int64_t M, int N, int K, int C, const Ctx& ctx);

// out = in converted (rounded to nearest even when narrowing). Instantiated for float <-> bf16/f16
// and float -> float (a copy).
template <class D, class S>
void convert(D* out, const S* in, int64_t N, const Ctx& ctx);

// AdamW (Loshchilov & Hutter 2019), decoupled weight decay, bias correction with step t >= 1:
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p).
// With grad_scale (one float in the memory of ctx's device) g = grads * *grad_scale, rounded to fp32
// as scale() would round it: unscaling and clipping without a pass over the gradients, and without
// the host reading the factor.
void adamw(float* params, float* m, float* v, const float* grads, int64_t N, float lr, float beta1, float beta2,
           float eps, float weight_decay, int t, const Ctx& ctx, const float* grad_scale = nullptr);

// Sum of squares accumulated in double over fixed-size blocks (result independent of thread count).
double sum_squares(const float* x, int64_t N, const Ctx& ctx);
// The same sum left at *out in the memory of ctx's device (added to *out when accumulate), so the host
// does not wait for it.
void sum_squares_into(double* out, const float* x, int64_t N, bool accumulate, const Ctx& ctx);
// *coef = clip_coefficient(*sum_sq, inv_scale, max_norm) (kernels/clip_coefficient.h), both in the
// memory of ctx's device.
void clip_coefficient(float* coef, const double* sum_sq, double inv_scale, double max_norm, const Ctx& ctx);
void scale(float* x, float s, int64_t N, const Ctx& ctx);
// Rounds fp32 values in place to the nearest bf16/f16 value (no-op for f32): the compute copy of
// the weights holds the values its storage type can represent.
void round_to(float* x, int64_t N, DType t, const Ctx& ctx);
// True when no element is inf or NaN (fp16 loss-scaling overflow check).
bool all_finite(const float* x, int64_t N, const Ctx& ctx);

}  // namespace mt::ops
