// The CUDA backend: the same op set and semantics as kernels/ops.h, on device pointers, launched on
// the stream in ctx (cudaStream_t). Declared here without CUDA headers so the dispatcher in
// kernels/ops.cpp can call it from plain C++.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/ops.h"
#include "runtime/memory.h"

namespace mt::cuda {

// Storage type S: float, mt::bf16 or mt::f16 (instantiated for all three in the .cu files, which view
// bf16/f16 as __nv_bfloat16/__half). Parameter gradients, statistics and losses are fp32.
template <class S>
void encoder_fwd(S* out, const int32_t* tokens, const int32_t* pos, const S* wte, const S* wpe, int B, int T, int C,
                 const ops::Ctx& ctx);
template <class S>
void encoder_bwd(float* dwte, float* dwpe, const S* dout, const int32_t* tokens, const int32_t* pos, int B, int T,
                 int C, const ops::Ctx& ctx);
template <class S>
void layernorm_fwd(S* out, float* mean, float* rstd, const S* inp, const S* weight, const S* bias, int N, int C,
                   const ops::Ctx& ctx);
template <class S>
void residual_layernorm_fwd(S* res, S* out, float* mean, float* rstd, const S* a, const S* b, const S* weight,
                            const S* bias, int N, int C, const ops::Ctx& ctx);
template <class S>
void layernorm_bwd(S* dinp, float* dweight, float* dbias, const S* dout, const S* inp, const S* weight,
                   const float* mean, const float* rstd, int N, int C, bool accumulate, const ops::Ctx& ctx);
template <class S>
void matmul_fwd(S* out, const S* inp, const S* weight, const S* bias, int N, int IC, int OC, const ops::Ctx& ctx,
                S* pre_gelu, const S* residual);
template <class S>
void matmul_bwd(S* dinp, float* dweight, float* dbias, const S* dout, const S* inp, const S* weight, int N, int IC,
                int OC, const ops::Ctx& ctx, const S* pre_gelu, bool dweight_assign);
template <class S>
void gelu_fwd(S* out, const S* inp, int64_t N, const ops::Ctx& ctx);
template <class S>
void gelu_bwd(S* dinp, const S* dout, const S* inp, int64_t N, const ops::Ctx& ctx);
template <class S>
void attention_fwd(S* out, S* att, const S* qkv, const int32_t* doc, int B, int T, int C, int NH,
                   const ops::Ctx& ctx);
template <class S>
void attention_bwd(S* dqkv, float* scratch, const S* dout, const S* qkv, const S* att, const int32_t* doc, int B,
                   int T, int C, int NH, const ops::Ctx& ctx);
template <class S>
void flash_attention_fwd(S* out, float* lse, const S* qkv, const int32_t* doc, int B, int T, int C, int NH,
                         const ops::Ctx& ctx);
template <class S>
void flash_attention_bwd(S* dqkv, float* scratch, const S* dout, const S* qkv, const S* out, const float* lse,
                         const int32_t* doc, int B, int T, int C, int NH, const ops::Ctx& ctx);
// Block attention (ops.h; flash_block.cu): positions and document ids in device memory.
template <class S>
void flash_block_fwd(float* out, float* lse, const S* q, int ldq, const S* k, const S* v, int ldkv,
                     const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B,
                     int Tq, int Tk, int C, int NH, const ops::Ctx& ctx);
void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse, int B, int T, int C,
                     int NH, const ops::Ctx& ctx);
template <class S>
void attention_delta(float* delta, const S* dout, const S* out, int B, int T, int C, int NH, const ops::Ctx& ctx);
template <class S>
void flash_block_bwd(float* dq, float* dk, float* dv, int lddkv, const S* dout, const S* q, int ldq, const S* k,
                     const S* v, int ldkv, const float* lse, const float* delta, const int32_t* q_pos,
                     const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int B, int Tq, int Tk, int C,
                     int NH, const ops::Ctx& ctx);
template <class T>
void copy_columns(T* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t cols,
                  const ops::Ctx& ctx);
// Whether flash attention in storage type t at head size hs runs the tensor-core kernels on the
// current device (for 16-byte aligned tensors), rather than the fp32 SIMT ones.
bool flash_attention_on_tensor_cores(DType t, int hs, bool backward);
template <class S>
void add(S* out, const S* a, const S* b, int64_t N, const ops::Ctx& ctx);
template <class S>
void softmax_xent(float* losses, S* dlogits, const S* logits, const int32_t* targets, float dloss, int N, int V,
                  int Vp, const ops::Ctx& ctx);
template <class S>
void embedding_fwd(S* out, const int32_t* ids, const S* table, int row0, int rows, int N, int C,
                   const ops::Ctx& ctx);
template <class S>
void embedding_bwd(float* dtable, const S* dout, const int32_t* ids, int row0, int rows, int N, int C,
                   const ops::Ctx& ctx);
template <class S>
void xent_slice_stats(float* stats, const S* logits, const int32_t* targets, int col0, int N, int V, int Vl,
                      const ops::Ctx& ctx);
template <class S>
void xent_slice_finish(float* losses, S* dlogits, const S* logits, const float* stats, int P, const int32_t* targets,
                       float dloss, int col0, int N, int V, int Vl, const ops::Ctx& ctx);
// Mixture of experts (moe.cu, kernels in moe_kernels.cuh).
void moe_route(float* probs, float* lse, double* lse_sq, int32_t* expert, float* gate, const float* logits,
               const float* bias, int N, int E, int K, const ops::Ctx& ctx);
void moe_route_stats(double* sums, const float* probs, const double* lse_sq, int N, int E, const ops::Ctx& ctx);
void moe_route_bwd(float* dlogits, const float* dgate, const float* probs, const float* lse, const int32_t* expert,
                   const float* gate, const int32_t* load, int N, int E, int K, double aux_weight, double z_weight,
                   const ops::Ctx& ctx);
void moe_plan(int32_t* load, int32_t* offset, int32_t* row_of, int32_t* assignment_of, const int32_t* expert, int N,
              int K, int E, int64_t capacity, const ops::Ctx& ctx);
template <class S>
void moe_permute(S* out, const S* x, const int32_t* assignment_of, int64_t M, int K, int C, const ops::Ctx& ctx);
template <class S>
void moe_unpermute(S* out, const S* rows, const int32_t* row_of, int64_t A, int C, const ops::Ctx& ctx);
template <class S>
void moe_permute_bwd(S* dx, const S* drows, const float* extra, const int32_t* row_of, int N, int K, int C,
                     const ops::Ctx& ctx);
template <class S>
void moe_combine(S* y, const S* rows, const float* gate, const S* base, const int32_t* row_of, int N, int K, int C,
                 const ops::Ctx& ctx);
template <class S>
void moe_combine_bwd(S* drows, float* dgate, const S* dy, const S* rows, const float* gate, const int32_t* row_of,
                     const int32_t* assignment_of, int64_t M, int N, int K, int C, const ops::Ctx& ctx);
template <class D, class S>
void convert(D* out, const S* in, int64_t N, const ops::Ctx& ctx);
void adamw(float* params, float* m, float* v, const float* grads, int64_t N, float lr, float beta1, float beta2,
           float eps, float weight_decay, int t, const ops::Ctx& ctx, const float* grad_scale);
double sum_squares(const float* x, int64_t N, const ops::Ctx& ctx);
void sum_squares_into(double* out, const float* x, int64_t N, bool accumulate, const ops::Ctx& ctx);
void clip_coefficient(float* coef, const double* sum_sq, double inv_scale, double max_norm, const ops::Ctx& ctx);
void scale(float* x, float s, int64_t N, const ops::Ctx& ctx);
void round_to(float* x, int64_t N, DType t, const ops::Ctx& ctx);
bool all_finite(const float* x, int64_t N, const ops::Ctx& ctx);

// Device management used by tests and the CLI.
int device_count();  // 0 when no GPU or no driver
void* device_alloc(size_t bytes);
void device_free(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// The calling thread's current device, and making `index` current for it (cudaSetDevice only: for
// helper threads of a process whose main thread ran set_device).
int current_device();
void use_device(int index);
// Page-locked host memory (cudaHostAlloc), for staging buffers that device-to-host copies fill.
void* pinned_alloc(size_t bytes);
void pinned_free(void* p);  // does not throw (used from destructors)
void synchronize();  // the whole device (tests and tools; the trainer waits on streams)
// Returns when the work queued so far on `stream` (a cudaStream_t; nullptr: the default stream) is
// done: an event recorded there and waited for, polled by `wait` under its deadline (runtime/
// device_wait.h) or, without one, with cudaEventSynchronize. Never device-wide: another stream's work
// (NCCL's) is waited for only as far as this stream depends on it. `what`: a string literal.
void wait_for_stream(void* stream, const DeviceWait* wait, const char* what);
// Returns when `event` (a cudaEvent_t, recorded) has fired, waited for as wait_for_stream does.
void wait_for_event(void* event, const DeviceWait* wait, const char* what);
// Memory in use on the current device as the driver sees it (cudaMemGetInfo: every allocation of
// this process and others, the context, the pool's cached blocks), and the device's total.
struct DeviceMemoryInfo {
  size_t used = 0, total = 0;
};
DeviceMemoryInfo device_memory_info();

// Device memory for the trainer (runtime/memory.h): blocks from the device's stream-ordered pool
// (cudaMallocAsync), zeroed, copies and zeroing ordered on the default stream with the ops.
const MemOps& device_memory();
// Makes `index` the calling thread's device and lets its memory pool keep freed blocks (the trainer
// frees and reallocates its activations every micro-batch).
void set_device(int index);
std::string device_name();  // of the current device, e.g. "NVIDIA H200"
void device_memset_zero(void* p, size_t bytes);
// Times ops with CUDA events recorded on `stream` (kernels/op_timer.h).
std::unique_ptr<ops::OpTimer> make_event_timer(void* stream);
void copy_on_device(void* dst, const void* src, size_t bytes);

}  // namespace mt::cuda
