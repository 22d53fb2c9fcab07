// The checkpoint snapshot's copy stream (snapshot_copy.h).
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/snapshot_copy.h"

namespace mt::cuda {

SnapshotCopier::SnapshotCopier(void* compute_stream) : compute_(compute_stream) {
  MT_CUDA_CHECK(cudaGetDevice(&device_));
  cudaStream_t s = nullptr;
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  cudaEvent_t e = nullptr;
  const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (err != cudaSuccess) (void)cudaStreamDestroy(s);
  MT_CUDA_CHECK(err);
  marked_ = e;
}

// Must not throw: a failing call means the context is broken, and the next checked call says so.
SnapshotCopier::~SnapshotCopier() {
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(marked_));
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void SnapshotCopier::mark() {
  MT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(marked_), static_cast<cudaStream_t>(compute_)));
}

void SnapshotCopier::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  MT_CUDA_CHECK(cudaSetDevice(device_));  // the checkpoint writer's thread
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  MT_CUDA_CHECK(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(marked_), 0));
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace mt::cuda
