// The CPU reference backend, templated on the storage type S: float, bf16 and f16 are what training
// runs (runtime/storage.h), double is what the finite-difference tests use. Arithmetic is in
// A = acc_t<S> (float, or double for double); low-precision values are rounded once, on store.
// Semantics are exactly those documented in kernels/ops.h.
#pragma once
#include <cstdint>

#include "kernels/cpu/vec_math.h"  // SimdPath
#include "runtime/storage.h"

namespace mt::cpu {

template <class S>
void encoder_fwd(S* out, const int32_t* tokens, const int32_t* pos, const S* wte, const S* wpe, int B, int T_,
                 int C);
template <class S>
void encoder_bwd(acc_t<S>* dwte, acc_t<S>* dwpe, const S* dout, const int32_t* tokens, const int32_t* pos, int B,
                 int T_, int C);
// Vocabulary-parallel ops (kernels/cpu/vocab_parallel.cpp).
template <class S>
void embedding_fwd(S* out, const int32_t* ids, const S* table, int row0, int rows, int N, int C);
template <class S>
void embedding_bwd(acc_t<S>* dtable, const S* dout, const int32_t* ids, int row0, int rows, int N, int C);
template <class S>
void xent_slice_stats(acc_t<S>* stats, const S* logits, const int32_t* targets, int col0, int N, int V, int Vl);
template <class S>
void xent_slice_finish(acc_t<S>* losses, S* dlogits, const S* logits, const acc_t<S>* stats, int P,
                       const int32_t* targets, acc_t<S> dloss, int col0, int N, int V, int Vl);
template <class S>
void layernorm_fwd(S* out, acc_t<S>* mean, acc_t<S>* rstd, const S* inp, const S* weight, const S* bias, int N,
                   int C);
template <class S>
void residual_layernorm_fwd(S* res, S* out, acc_t<S>* mean, acc_t<S>* rstd, const S* a, const S* b,
                            const S* weight, const S* bias, int N, int C);
template <class S>
void layernorm_bwd(S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp, const S* weight,
                   const acc_t<S>* mean, const acc_t<S>* rstd, int N, int C, bool accumulate = false);
template <class S>
void matmul_fwd(S* out, const S* inp, const S* weight, const S* bias, int N, int IC, int OC, S* pre_gelu = nullptr,
                const S* residual = nullptr);
// dweight_assign: dweight = dout^T @ inp instead of +=, its old contents not read (ops::GradOut).
template <class S>
void matmul_bwd(S* dinp, acc_t<S>* dweight, acc_t<S>* dbias, const S* dout, const S* inp, const S* weight, int N,
                int IC, int OC, const S* pre_gelu = nullptr, bool dweight_assign = false);
template <class S>
void gelu_fwd(S* out, const S* inp, int64_t N);
template <class S>
void gelu_bwd(S* dinp, const S* dout, const S* inp, int64_t N);
// The same on one vector path (the same arithmetic widened, the same bits on every path; gelu_fwd and
// gelu_bwd take the widest this CPU runs). For tests.
template <class S>
void gelu_fwd_via(SimdPath path, S* out, const S* inp, int64_t N);
template <class S>
void gelu_bwd_via(SimdPath path, S* dinp, const S* dout, const S* inp, int64_t N);
template <class S>
void attention_fwd(S* out, S* att, const S* qkv, const int32_t* doc, int B, int T_, int C, int NH);
template <class S>
void attention_bwd(S* dqkv, acc_t<S>* scratch, const S* dout, const S* qkv, const S* att, const int32_t* doc, int B,
                   int T_, int C, int NH);
template <class S>
void flash_attention_fwd(S* out, acc_t<S>* lse, const S* qkv, const int32_t* doc, int B, int T_, int C, int NH);
template <class S>
void flash_attention_bwd(S* dqkv, acc_t<S>* scratch, const S* dout, const S* qkv, const S* out,
                         const acc_t<S>* lse, const int32_t* doc, int B, int T_, int C, int NH);
// Block attention, ring attention's kernel (kernels/cpu/flash_attention_block.cpp; ops.h documents it).
bool attention_block_hidden(const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc,
                            int B, int Tq, int Tk);
template <class S>
void flash_block_fwd(acc_t<S>* out, acc_t<S>* lse, const S* q, int ldq, const S* k, const S* v, int ldkv,
                     const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B,
                     int Tq, int Tk, int C, int NH);
template <class A>
void attention_merge(A* out, A* lse, const A* part_out, const A* part_lse, int B, int T, int C, int NH);
template <class S>
void attention_delta(acc_t<S>* delta, const S* dout, const S* out, int B, int T, int C, int NH);
template <class S>
void flash_block_bwd(acc_t<S>* dq, acc_t<S>* dk, acc_t<S>* dv, int lddkv, const S* dout, const S* q, int ldq,
                     const S* k, const S* v, int ldkv, const acc_t<S>* lse, const acc_t<S>* delta,
                     const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B,
                     int Tq, int Tk, int C, int NH);
template <class T>
void copy_columns(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t cols);
template <class S>
void add(S* out, const S* a, const S* b, int64_t N);
template <class S>
void softmax_xent(acc_t<S>* losses, S* dlogits, const S* logits, const int32_t* targets, acc_t<S> dloss, int N,
                  int V, int Vp);
template <class D, class S>
void convert(D* out, const S* in, int64_t N);
template <class T>
void adamw(T* params, T* m, T* v, const T* grads, int64_t N, T lr, T beta1, T beta2, T eps, T weight_decay, int t,
           const T* grad_scale = nullptr);
template <class T>
double sum_squares(const T* x, int64_t N);
// sum_squares<float> on one vector path (the same lanes, added in the same order: the same bits);
// sum_squares takes the widest this CPU runs. For tests, which run every path the CPU can.
double sum_squares_via(SimdPath path, const float* x, int64_t N);
template <class T>
void scale(T* x, T s, int64_t N);
void round_to(float* x, int64_t N, int dtype /* mt::DType */);
bool all_finite(const float* x, int64_t N);

// Mixture-of-experts ops (kernels/cpu/moe.cpp; semantics in kernels/ops.h). The router's arrays are
// fp32 (double for the finite-difference tests' storage type too); the moves are templated on S.
void moe_route(float* probs, float* lse, double* lse_sq, int32_t* expert, float* gate, const float* logits,
               const float* bias, int N, int E, int K);
void moe_route_stats(double* sums, const float* probs, const double* lse_sq, int N, int E);
void moe_route_bwd(float* dlogits, const float* dgate, const float* probs, const float* lse, const int32_t* expert,
                   const float* gate, const int32_t* load, int N, int E, int K, double aux_weight, double z_weight);
void moe_plan(int32_t* load, int32_t* offset, int32_t* row_of, int32_t* assignment_of, const int32_t* expert, int N,
              int K, int E, int64_t capacity);
template <class S>
void moe_permute(S* out, const S* x, const int32_t* assignment_of, int64_t M, int K, int C);
template <class S>
void moe_unpermute(S* out, const S* rows, const int32_t* row_of, int64_t A, int C);
template <class S>
void moe_permute_bwd(S* dx, const S* drows, const float* extra, const int32_t* row_of, int N, int K, int C);
template <class S>
void moe_combine(S* y, const S* rows, const float* gate, const S* base, const int32_t* row_of, int N, int K, int C);
template <class S>
void moe_combine_bwd(S* drows, float* dgate, const S* dy, const S* rows, const float* gate, const int32_t* row_of,
                     int N, int K, int C);

}  // namespace mt::cpu
