// A device temporary of `count` values of T, allocated and freed on the op's stream (stream-ordered:
// work queued later on the stream may reuse it), and freed on scope exit, also when a check throws.
// Every launcher that needs scratch takes it this way: no per-process buffers, and safe when several
// streams run ops at once.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/cuda_check.cuh"

namespace mt::cuda {

template <class T>
class StreamTemp {
 public:
  StreamTemp(size_t count, cudaStream_t stream) : stream_(stream) {
    if (count) MT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&p_), count * sizeof(T), stream));
  }
  StreamTemp(const StreamTemp&) = delete;
  StreamTemp& operator=(const StreamTemp&) = delete;
  ~StreamTemp() {
    if (p_) (void)cudaFreeAsync(p_, stream_);  // runs in unwinding too: must not throw
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace mt::cuda
