// Dispatch of every op in ops.h to its backend by ctx.device.
#include "kernels/ops.h"

#include "kernels/cpu/cpu_ops.h"
#include "runtime/check.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mt::ops {

#ifdef MT_HAVE_CUDA
#define MT_DISPATCH(cpu_call, cuda_call) \
  do {                                \
    if (ctx.device == Device::cuda) return cuda_call; \
    return cpu_call;                  \
  } while (0)
#else
#define MT_DISPATCH(cpu_call, cuda_call) \
  do {                                \
    MT_CHECK(ctx.device == Device::cpu, "this build has no CUDA backend (configure with MT_CUDA=ON)"); \
    return cpu_call;                  \
  } while (0)
#endif

void encoder_fwd(float* out, const int32_t* tokens, const int32_t* pos, const float* wte, const float* wpe, int B, int T, int C, const Ctx& ctx) {
  MT_DISPATCH(cpu::encoder_fwd<float>(out, tokens, pos, wte, wpe, B, T, C), cuda::encoder_fwd(out, tokens, pos, wte, wpe, B, T, C, ctx));
}

void encoder_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* pos, int B, int T, int C, const Ctx& ctx) {
  MT_DISPATCH(cpu::encoder_bwd<float>(dwte, dwpe, dout, tokens, pos, B, T, C), cuda::encoder_bwd(dwte, dwpe, dout, tokens, pos, B, T, C, ctx));
}

void layernorm_fwd(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias, int N, int C, const Ctx& ctx) {
  MT_DISPATCH(cpu::layernorm_fwd<float>(out, mean, rstd, inp, weight, bias, N, C), cuda::layernorm_fwd(out, mean, rstd, inp, weight, bias, N, C, ctx));
}

void layernorm_bwd(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, const float* mean, const float* rstd, int N, int C, const Ctx& ctx) {
  MT_DISPATCH(cpu::layernorm_bwd<float>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C), cuda::layernorm_bwd(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, ctx));
}

void matmul_fwd(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC, const Ctx& ctx) {
  MT_DISPATCH(cpu::matmul_fwd<float>(out, inp, weight, bias, N, IC, OC), cuda::matmul_fwd(out, inp, weight, bias, N, IC, OC, ctx));
}

void matmul_bwd(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* weight, int N, int IC, int OC, const Ctx& ctx) {
  MT_DISPATCH(cpu::matmul_bwd<float>(dinp, dweight, dbias, dout, inp, weight, N, IC, OC), cuda::matmul_bwd(dinp, dweight, dbias, dout, inp, weight, N, IC, OC, ctx));
}

void gelu_fwd(float* out, const float* inp, int64_t N, const Ctx& ctx) {
  MT_DISPATCH(cpu::gelu_fwd<float>(out, inp, N), cuda::gelu_fwd(out, inp, N, ctx));
}

void gelu_bwd(float* dinp, const float* dout, const float* inp, int64_t N, const Ctx& ctx) {
  MT_DISPATCH(cpu::gelu_bwd<float>(dinp, dout, inp, N), cuda::gelu_bwd(dinp, dout, inp, N, ctx));
}

void attention_fwd(float* out, float* att, const float* qkv, const int32_t* doc, int B, int T, int C, int NH, const Ctx& ctx) {
  MT_DISPATCH(cpu::attention_fwd<float>(out, att, qkv, doc, B, T, C, NH), cuda::attention_fwd(out, att, qkv, doc, B, T, C, NH, ctx));
}

void attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, const int32_t* doc, int B, int T, int C, int NH, const Ctx& ctx) {
  MT_DISPATCH(cpu::attention_bwd<float>(dqkv, scratch, dout, qkv, att, doc, B, T, C, NH), cuda::attention_bwd(dqkv, scratch, dout, qkv, att, doc, B, T, C, NH, ctx));
}

void add(float* out, const float* a, const float* b, int64_t N, const Ctx& ctx) {
  MT_DISPATCH(cpu::add<float>(out, a, b, N), cuda::add(out, a, b, N, ctx));
}

void softmax_xent(float* losses, float* dlogits, const float* logits, const int32_t* targets, float dloss, int N, int V, int Vp, const Ctx& ctx) {
  MT_DISPATCH(cpu::softmax_xent<float>(losses, dlogits, logits, targets, dloss, N, V, Vp), cuda::softmax_xent(losses, dlogits, logits, targets, dloss, N, V, Vp, ctx));
}

void adamw(float* params, float* m, float* v, const float* grads, int64_t N, float lr, float beta1, float beta2, float eps, float weight_decay, int t, const Ctx& ctx) {
  MT_DISPATCH(cpu::adamw<float>(params, m, v, grads, N, lr, beta1, beta2, eps, weight_decay, t), cuda::adamw(params, m, v, grads, N, lr, beta1, beta2, eps, weight_decay, t, ctx));
}

double sum_squares(const float* x, int64_t N, const Ctx& ctx) {
  MT_DISPATCH(cpu::sum_squares<float>(x, N), cuda::sum_squares(x, N, ctx));
}

void scale(float* x, float s, int64_t N, const Ctx& ctx) {
  MT_DISPATCH(cpu::scale<float>(x, s, N), cuda::scale(x, s, N, ctx));
}

void round_to(float* x, int64_t N, DType t, const Ctx& ctx) {
  MT_DISPATCH(cpu::round_to(x, N, int(t)), cuda::round_to(x, N, t, ctx));
}

bool all_finite(const float* x, int64_t N, const Ctx& ctx) {
  MT_DISPATCH(cpu::all_finite(x, N), cuda::all_finite(x, N, ctx));
}

}  // namespace mt::ops
