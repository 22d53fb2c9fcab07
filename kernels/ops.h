// The op interface: forward AND backward of every op the model uses. One signature, two backends:
// kernels/cpu/ (the reference, float and double) and kernels/cuda/ (the fast path). The model calls
// only these functions; `ctx.device` picks the backend.
//
// Conventions (as in llm.c):
//  - argument order: outputs, inputs, sizes, then the context;
//  - all tensors are row-major, float32 storage; low precision is emulated by rounding (round_to)
//    at the points where the GPU stores bf16/fp16;
//  - parameter gradients ACCUMULATE (+=), activation gradients are ASSIGNED (=);
//  - shapes in comments: B batch, T time, C channels, NH heads, hs = C/NH, V vocab, Vp padded vocab,
//    N rows (= B*T), IC/OC in/out features;
//  - CPU results are bitwise deterministic for a fixed thread count.
#pragma once
#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace mt::ops {

struct Ctx {
  Device device = Device::cpu;
  void* stream = nullptr;  // cudaStream_t on the CUDA backend
};

// out[b,t,:] = wte[tokens[b,t],:] + wpe[pos[b,t],:]; pos == nullptr means pos[b,t] = t.
// out (B,T,C), tokens/pos (B,T), wte (V,C), wpe (maxT,C).
void encoder_fwd(float* out, const int32_t* tokens, const int32_t* pos, const float* wte, const float* wpe,
                 int B, int T, int C, const Ctx& ctx);
// dwte += scatter(dout), dwpe += scatter(dout)
void encoder_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* pos,
                 int B, int T, int C, const Ctx& ctx);

// LayerNorm over the last dim, eps = 1e-5. out (N,C); mean, rstd (N) saved for backward.
void layernorm_fwd(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                   const float* bias, int N, int C, const Ctx& ctx);
// dinp = ..., dweight += ..., dbias += ...
void layernorm_bwd(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                   const float* weight, const float* mean, const float* rstd, int N, int C, const Ctx& ctx);

// out (N,OC) = inp (N,IC) @ weight (OC,IC)^T + bias (OC); bias may be nullptr.
void matmul_fwd(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC,
                const Ctx& ctx);
// dinp = dout @ weight (skipped if dinp == nullptr); dweight += dout^T @ inp; dbias += colsum(dout)
// (skipped if dbias == nullptr).
void matmul_bwd(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                const float* weight, int N, int IC, int OC, const Ctx& ctx);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_fwd(float* out, const float* inp, int64_t N, const Ctx& ctx);
void gelu_bwd(float* dinp, const float* dout, const float* inp, int64_t N, const Ctx& ctx);

// Causal self-attention. qkv (B,T,3C) holds [q | k | v], each (NH, hs) per token; out (B,T,C).
// att (B,NH,T,T) receives the softmax probabilities (saved for backward; entries a token may not
// attend to are 0). doc (B,T) may be nullptr; if given, token i attends to j iff j <= i and
// doc[i] == doc[j] (packed documents do not see each other). Scores are scaled by 1/sqrt(hs).
void attention_fwd(float* out, float* att, const float* qkv, const int32_t* doc, int B, int T, int C, int NH,
                   const Ctx& ctx);
// dqkv (B,T,3C) = ...; scratch (B,NH,T,T) is workspace.
void attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                   const int32_t* doc, int B, int T, int C, int NH, const Ctx& ctx);

// out = a + b (out may alias a or b).
void add(float* out, const float* a, const float* b, int64_t N, const Ctx& ctx);

// Fused softmax + cross-entropy over a padded vocabulary. logits (N,Vp), only the first V columns
// are real. losses[i] = -log softmax(logits[i,:V])[targets[i]], or 0 where targets[i] < 0 (ignored).
// If dlogits != nullptr: dlogits[i,:V] = dloss * (softmax - onehot(targets[i])), 0 in padded columns
// and in ignored rows. dlogits may alias logits (in-place backward).
void softmax_xent(float* losses, float* dlogits, const float* logits, const int32_t* targets, float dloss, int N,
                  int V, int Vp, const Ctx& ctx);

// AdamW (Loshchilov & Hutter 2019), decoupled weight decay, bias correction with step t >= 1:
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p).
void adamw(float* params, float* m, float* v, const float* grads, int64_t N, float lr, float beta1, float beta2,
           float eps, float weight_decay, int t, const Ctx& ctx);

// Sum of squares accumulated in double over fixed-size blocks (result independent of thread count).
double sum_squares(const float* x, int64_t N, const Ctx& ctx);
void scale(float* x, float s, int64_t N, const Ctx& ctx);
// Rounds in place to bf16/f16 values (no-op for f32): the CPU twin of storing low precision.
void round_to(float* x, int64_t N, DType t, const Ctx& ctx);
// True when no element is inf or NaN (fp16 loss-scaling overflow check).
bool all_finite(const float* x, int64_t N, const Ctx& ctx);

}  // namespace mt::ops
