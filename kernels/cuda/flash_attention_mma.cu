// Flash attention on tensor cores (mma.sync m16n8k16, kernels/cuda/mma.cuh) for bf16/fp16 storage:
// the same algorithm, masks and outputs as the fp32 SIMT kernels of flash_attention.cu, which remain
// the path for fp32 storage, other head sizes and devices below compute capability 8.0.
//
// Block shape: 4 warps, 64 rows (queries, or keys for dK/dV); warp w owns rows 16w .. 16w+15 and
// computes its 16 x 64 score tile against a 64-row tile of the other side with 8 m16n8 accumulator
// tiles. The score tiles stay in registers: they are masked, exponentiated and rounded to the storage
// type there, and fed back as A fragments of the next product (mma::a_from_acc), as FlashAttention-2
// does. Operand tiles are staged in shared memory in the storage type, rows padded by 8 elements so
// the fragment loads (ldmatrix) are free of bank conflicts.
//
// The streamed tiles (K, V in the forward and dQ kernels; Q, dO in the dK/dV kernel) are double
// buffered and copied with cp.async (kernels/cuda/async_copy.cuh): tile i + 1 is in flight while
// tile i is worked on, and no registers stage the copy. In the backward kernels the block's own two
// tiles are read into fragments once, after which their shared memory serves as the second buffer.
//
// Forward: S = Q K^T, online softmax in base 2 (scores scaled by log2(e)/sqrt(hs); lse converted back
// to natural log on store), O += P V with P rounded to 16 bits. Each lane keeps partial row sums of P;
// the quad (4 lanes sharing a row) adds them once at the end.
// Backward, deterministic and without atomics (as the SIMT kernels): one kernel per key block owns
// dK, dV (S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q), one per query block owns dQ
// (S = Q K^T, dP = dO V^T, dQ += dS K), where P = exp(S/sqrt(hs) - lse) and dS = P (dP - D). P and dS
// are rounded to 16 bits as the multiplicands of the last products; all sums are fp32.
#include <cmath>
#include <cstdint>
#include <string>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/flash_attention_mma.cuh"
#include "kernels/cuda/flash_attention_mma_kernels.cuh"
#include "kernels/cuda/shared_memory.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda::flash_mma {
namespace {

using namespace kernels;

template <class D, int HS>
void launch_fwd(D* out, float* lse, const D* qkv, const int32_t* doc, int B, int T, int C, int NH, cudaStream_t st) {
  const LaunchShape ls = fwd_shape<D, HS>(B, T, NH);
  opt_in_shared_memory(fwd_kernel<D, HS>, ls.smem, "flash attention (tensor cores)");
  const float scale_log2 = kLog2e / std::sqrt(float(HS));
  MT_LAUNCH(ls, st, fwd_kernel<D, HS>)(out, lse, qkv, doc, T, C, NH, scale_log2);
  MT_CUDA_CHECK_LAUNCH();
}

template <class D, int HS>
void launch_bwd(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* dsum, const int32_t* doc, int B,
                int T, int C, int NH, cudaStream_t st) {
  const LaunchShape ls = bwd_shape<D, HS>(B, T, NH);
  const float scale = 1.f / std::sqrt(float(HS)), scale_log2 = kLog2e * scale;
  opt_in_shared_memory(dkdv_kernel<D, HS>, ls.smem, "flash attention (tensor cores)");
  MT_LAUNCH(ls, st, dkdv_kernel<D, HS>)(dqkv, dout, qkv, lse, dsum, doc, T, C, NH, scale, scale_log2);
  MT_CUDA_CHECK_LAUNCH();
  opt_in_shared_memory(dq_kernel<D, HS>, ls.smem, "flash attention (tensor cores)");
  MT_LAUNCH(ls, st, dq_kernel<D, HS>)(dqkv, dout, qkv, lse, dsum, doc, T, C, NH, scale, scale_log2);
  MT_CUDA_CHECK_LAUNCH();
}

// MT_FLASH_SIMT=1 (any value but empty or 0) sends every call to the SIMT kernels: a way around the
// tensor-core kernels, without a rebuild, on a device where `minitrain selftest` finds them wrong. Read
// once per process.
bool disabled_by_environment() {
  static const bool disabled = [] {
    const char* v = std::getenv("MT_FLASH_SIMT");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return disabled;
}

bool tensor_cores_available() {
  if (disabled_by_environment()) return false;
  int dev = 0, major = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 8;
}

}  // namespace

bool takes_fwd(int hs, const void* out, const void* qkv) {
  return (hs == 32 || hs == 64 || hs == 128) && aligned16({out, qkv}) && tensor_cores_available();
}

bool takes_bwd(int hs, const void* dqkv, const void* dout, const void* qkv) {
  return (hs == 32 || hs == 64) && aligned16({dqkv, dout, qkv}) && tensor_cores_available();
}

template <class D>
void fwd(D* out, float* lse, const D* qkv, const int32_t* doc, int B, int T, int C, int NH, cudaStream_t stream) {
  switch (C / NH) {
    case 32: launch_fwd<D, 32>(out, lse, qkv, doc, B, T, C, NH, stream); break;
    case 64: launch_fwd<D, 64>(out, lse, qkv, doc, B, T, C, NH, stream); break;
    case 128: launch_fwd<D, 128>(out, lse, qkv, doc, B, T, C, NH, stream); break;
    default: MT_CHECK(false, "flash_attention_fwd: no tensor-core kernel for head size %d", C / NH);
  }
}

template <class D>
void bwd(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* dsum, const int32_t* doc, int B, int T,
         int C, int NH, cudaStream_t stream) {
  switch (C / NH) {
    case 32: launch_bwd<D, 32>(dqkv, dout, qkv, lse, dsum, doc, B, T, C, NH, stream); break;
    case 64: launch_bwd<D, 64>(dqkv, dout, qkv, lse, dsum, doc, B, T, C, NH, stream); break;
    default: MT_CHECK(false, "flash_attention_bwd: no tensor-core kernel for head size %d", C / NH);
  }
}

#define MT_FLASH_MMA_INSTANTIATE(D)                                                                        \
  template void fwd<D>(D*, float*, const D*, const int32_t*, int, int, int, int, cudaStream_t);           \
  template void bwd<D>(D*, const D*, const D*, const float*, const float*, const int32_t*, int, int, int, int, \
                       cudaStream_t);
MT_FLASH_MMA_INSTANTIATE(__nv_bfloat16)
MT_FLASH_MMA_INSTANTIATE(__half)
#undef MT_FLASH_MMA_INSTANTIATE

}  // namespace mt::cuda::flash_mma
