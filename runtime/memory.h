// MemOps: the few things code above the kernels does to raw memory — allocate (zeroed), free, zero,
// copy, round to the compute precision, wait — for one kind of memory. Host memory is implemented
// here; the CUDA backend supplies device memory (kernels/cuda/cuda_ops.h, cuda::device_memory()).
//
// An Arena is built on one MemOps and hands it out (Arena::mem()), so whoever owns a buffer from the
// arena also knows how to zero and copy it: the ParamStore refreshes its compute copy with it, data
// parallelism moves shards with it, and the model uploads its micro-batches with it. The struct holds
// plain function pointers and a pointer to how the host waits (owned elsewhere), so it can be copied
// freely.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/device_wait.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace mt {

// Direction of a copy relative to the memory a MemOps describes ("device" = that memory; for host
// memory every kind is a plain memcpy).
enum class CopyKind : uint8_t { host_to_device, device_to_host, device_to_device };

// Host-to-device copies that return without waiting for the device (a plain upload from pageable
// memory waits for all earlier device work first): the bytes are taken at once, so the caller may
// reuse its source, and the device copies them in the order of its work. One per arena.
class UploadStaging {
 public:
  virtual ~UploadStaging() = default;
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
};

struct MemOps {
  Device device = Device::cpu;
  void* (*alloc)(size_t bytes) = nullptr;  // zero-filled; nullptr when out of memory
  void (*free)(void* p) = nullptr;
  void (*zero)(void* p, size_t bytes) = nullptr;
  void (*copy)(void* dst, const void* src, size_t bytes, CopyKind kind) = nullptr;
  // dst (n elements of type t: f32, bf16 or f16) = src (n floats) rounded to t, to nearest even.
  void (*narrow)(void* dst, const float* src, int64_t n, DType t) = nullptr;
  // Returns when the work queued so far on this memory's stream is done (host: nothing to wait for):
  // a wait on that stream, never on the whole device; `wait` (non-null) polls it under its deadline.
  void (*wait_idle)(const DeviceWait* wait) = nullptr;
  // A block whose contents are unspecified, for buffers every reader writes first (activations):
  // a device skips the zero fill. Host memory fills it with 0xFF bytes instead, a NaN in every float
  // type, so that on the CPU any kernel reading such a buffer before writing it poisons the loss and
  // fails the tests. nullptr: `alloc`.
  void* (*alloc_uninit)(size_t bytes) = nullptr;
  // A staging for uploads that do not wait for the device; nullptr: `upload` already does not (host).
  // `wait`: how it waits for a region's earlier copy (MemOps::wait below).
  std::unique_ptr<UploadStaging> (*make_upload_staging)(const DeviceWait* wait) = nullptr;
  // How the host waits for this memory's device work (runtime/device_wait.h); nullptr: it blocks.
  const DeviceWait* wait = nullptr;

  void sync() const { wait_idle(wait); }
  void upload(void* dst, const void* src, size_t bytes) const { copy(dst, src, bytes, CopyKind::host_to_device); }
  // Waits for the work queued before it first (sync, under `wait`): the copy itself then finds its
  // stream idle, so a host never blocks in it behind a hung collective.
  void download(void* dst, const void* src, size_t bytes) const {
    sync();
    copy(dst, src, bytes, CopyKind::device_to_host);
  }
  void move(void* dst, const void* src, size_t bytes) const { copy(dst, src, bytes, CopyKind::device_to_device); }
};

// Host memory: 64-byte aligned blocks, memcpy/memset, OpenMP rounding.
const MemOps& host_memory();
// memset(p, byte, n) on host memory, split over the OpenMP threads when n is large and the caller is
// not already inside a parallel region (one core fills at about 6 GB/s on the development machine;
// two fill twice as fast): a step's gradient zeroing and the arena's fills.
void host_fill(void* p, int byte, size_t n);

}  // namespace mt
