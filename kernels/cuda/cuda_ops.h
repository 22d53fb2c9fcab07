// The CUDA backend: the same op set and semantics as kernels/ops.h, on device pointers, launched on
// the stream in ctx (cudaStream_t). Declared here without CUDA headers so the dispatcher in
// kernels/ops.cpp can call it from plain C++.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/ops.h"
#include "runtime/memory.h"

namespace mt::cuda {

void encoder_fwd(float* out, const int32_t* tokens, const int32_t* pos, const float* wte, const float* wpe,
                 int B, int T, int C, const ops::Ctx& ctx);
void encoder_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* pos,
                 int B, int T, int C, const ops::Ctx& ctx);
void layernorm_fwd(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                   const float* bias, int N, int C, const ops::Ctx& ctx);
void layernorm_bwd(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                   const float* weight, const float* mean, const float* rstd, int N, int C, const ops::Ctx& ctx);
void matmul_fwd(float* out, const float* inp, const float* weight, const float* bias, int N, int IC, int OC,
                const ops::Ctx& ctx);
void matmul_bwd(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                const float* weight, int N, int IC, int OC, const ops::Ctx& ctx);
void gelu_fwd(float* out, const float* inp, int64_t N, const ops::Ctx& ctx);
void gelu_bwd(float* dinp, const float* dout, const float* inp, int64_t N, const ops::Ctx& ctx);
void attention_fwd(float* out, float* att, const float* qkv, const int32_t* doc, int B, int T, int C, int NH,
                   const ops::Ctx& ctx);
void attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                   const int32_t* doc, int B, int T, int C, int NH, const ops::Ctx& ctx);
void add(float* out, const float* a, const float* b, int64_t N, const ops::Ctx& ctx);
void softmax_xent(float* losses, float* dlogits, const float* logits, const int32_t* targets, float dloss, int N,
                  int V, int Vp, const ops::Ctx& ctx);
void adamw(float* params, float* m, float* v, const float* grads, int64_t N, float lr, float beta1, float beta2,
           float eps, float weight_decay, int t, const ops::Ctx& ctx);
double sum_squares(const float* x, int64_t N, const ops::Ctx& ctx);
void scale(float* x, float s, int64_t N, const ops::Ctx& ctx);
void round_to(float* x, int64_t N, DType t, const ops::Ctx& ctx);
bool all_finite(const float* x, int64_t N, const ops::Ctx& ctx);

// Device management used by tests and the CLI.
int device_count();  // 0 when no GPU or no driver
void* device_alloc(size_t bytes);
void device_free(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void synchronize();

// Device memory for the trainer (runtime/memory.h): blocks from the device's stream-ordered pool
// (cudaMallocAsync), zeroed, copies and zeroing ordered on the default stream with the ops.
const MemOps& device_memory();
// Makes `index` the calling thread's device and lets its memory pool keep freed blocks (the trainer
// frees and reallocates its activations every micro-batch).
void set_device(int index);
std::string device_name();  // of the current device, e.g. "NVIDIA H200"
void device_memset_zero(void* p, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);

}  // namespace mt::cuda
