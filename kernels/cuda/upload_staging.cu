// The pinned upload ring (upload_staging.h).
#include <cstring>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/upload_staging.h"

namespace mt::cuda {

PinnedUploads::PinnedUploads(size_t capacity, const DeviceWait* wait) : capacity_(capacity), wait_(wait) {
  MT_CHECK(capacity_ > 0, "upload staging: capacity must be positive");
  MT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ring_), capacity_, cudaHostAllocDefault));
}

// Destructors must not throw: a failing wait means the context is broken, and the next checked call says so.
PinnedUploads::~PinnedUploads() {
  for (const InFlight& f : in_flight_) {
    (void)cudaEventSynchronize(static_cast<cudaEvent_t>(f.done));
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(f.done));
  }
  for (void* e : spare_events_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (ring_) (void)cudaFreeHost(ring_);
  for (char* r : outgrown_) (void)cudaFreeHost(r);
}

void PinnedUploads::retire_front() {
  const InFlight f = in_flight_.front();
  in_flight_.pop_front();
  cudaEvent_t done = static_cast<cudaEvent_t>(f.done);
  wait_for_event(done, wait_, "upload staging");  // at once when done (the usual case: a lap ago)
  spare_events_.push_back(f.done);
}

void PinnedUploads::grow(size_t bytes) {
  while (!in_flight_.empty()) retire_front();
  size_t cap = capacity_;
  while (cap < bytes) cap *= 2;
  char* ring = nullptr;
  MT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ring), cap, cudaHostAllocDefault));
  outgrown_.push_back(ring_);
  ring_ = ring;
  capacity_ = cap;
  head_ = 0;
}

void* PinnedUploads::reserve(size_t bytes) {
  if (bytes > capacity_) grow(bytes);
  if (head_ + bytes > capacity_) head_ = 0;  // wrap: the tail end stays unused this lap
  // The copies in flight lie in ring order, oldest first, and the oldest sit just ahead of head_:
  // those overlapping [head_, head_ + bytes) are a prefix of the queue.
  while (!in_flight_.empty()) {
    const InFlight& f = in_flight_.front();
    if (f.offset >= head_ + bytes || f.offset + f.bytes <= head_) break;
    retire_front();
  }
  return ring_ + head_;
}

void PinnedUploads::upload(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  void* stage = reserve(bytes);
  std::memcpy(stage, src, bytes);
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, stage, bytes, cudaMemcpyHostToDevice, 0));
  cudaEvent_t done = nullptr;
  if (!spare_events_.empty()) {
    done = static_cast<cudaEvent_t>(spare_events_.back());
    spare_events_.pop_back();
  } else {
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  }
  const cudaError_t e = cudaEventRecord(done, 0);
  if (e != cudaSuccess) (void)cudaEventDestroy(done);
  MT_CUDA_CHECK(e);
  in_flight_.push_back({head_, bytes, done});
  head_ += bytes;
}

std::unique_ptr<UploadStaging> make_pinned_uploads(const DeviceWait* wait) {
  return std::make_unique<PinnedUploads>(size_t(4) << 20, wait);
}

}  // namespace mt::cuda
