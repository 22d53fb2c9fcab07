// The tensor-core flash attention kernels (flash_attention_mma.cu), called by flash_attention.cu for
// bf16/fp16 storage when they take the shape; otherwise the fp32 SIMT kernels run.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mt::cuda::flash_mma {

// Whether the tensor-core kernels take a call: head size 32, 64 or 128 (forward) / 32 or 64
// (backward, whose accumulators would spill at 128), 16-byte aligned tensors, compute capability 8.0+.
bool takes_fwd(int hs, const void* out, const void* qkv);
bool takes_bwd(int hs, const void* dqkv, const void* dout, const void* qkv);

// D is __nv_bfloat16 or __half. Same arguments and results as flash_attention_fwd / _bwd (dsum holds
// rowsum(dO * O) per (b, h, query), computed by the caller).
template <class D>
void fwd(D* out, float* lse, const D* qkv, const int32_t* doc, int B, int T, int C, int NH, cudaStream_t stream);
template <class D>
void bwd(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* dsum, const int32_t* doc, int B, int T,
         int C, int NH, cudaStream_t stream);

}  // namespace mt::cuda::flash_mma
