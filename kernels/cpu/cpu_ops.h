// The CPU reference backend, templated on the scalar type: float is what training runs, double is
// what the finite-difference tests use. Semantics are exactly those documented in kernels/ops.h.
#pragma once
#include <cstdint>

namespace mt::cpu {

template <class T>
void encoder_fwd(T* out, const int32_t* tokens, const int32_t* pos, const T* wte, const T* wpe, int B, int T_,
                 int C);
template <class T>
void encoder_bwd(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, const int32_t* pos, int B, int T_, int C);
template <class T>
void layernorm_fwd(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N, int C);
template <class T>
void layernorm_bwd(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                   const T* rstd, int N, int C);
template <class T>
void matmul_fwd(T* out, const T* inp, const T* weight, const T* bias, int N, int IC, int OC);
template <class T>
void matmul_bwd(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N, int IC, int OC);
template <class T>
void gelu_fwd(T* out, const T* inp, int64_t N);
template <class T>
void gelu_bwd(T* dinp, const T* dout, const T* inp, int64_t N);
template <class T>
void attention_fwd(T* out, T* att, const T* qkv, const int32_t* doc, int B, int T_, int C, int NH);
template <class T>
void attention_bwd(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, const int32_t* doc, int B,
                   int T_, int C, int NH);
template <class T>
void add(T* out, const T* a, const T* b, int64_t N);
template <class T>
void softmax_xent(T* losses, T* dlogits, const T* logits, const int32_t* targets, T dloss, int N, int V, int Vp);
template <class T>
void adamw(T* params, T* m, T* v, const T* grads, int64_t N, T lr, T beta1, T beta2, T eps, T weight_decay, int t);
template <class T>
double sum_squares(const T* x, int64_t N);
template <class T>
void scale(T* x, T s, int64_t N);
void round_to(float* x, int64_t N, int dtype /* mt::DType */);
bool all_finite(const float* x, int64_t N);

}  // namespace mt::cpu
