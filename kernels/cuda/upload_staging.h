// Host-to-device uploads that do not drain the GPU (runtime/memory.h, UploadStaging).
//
// A cudaMemcpy from pageable host memory first waits for all earlier work on the device, so a
// micro-batch's tokens uploaded that way stall the host until the previous step's kernels are done,
// and under a pipeline every forward action drains the GPU before it can queue its stage. Here the
// bytes are copied at once into a ring of pinned host memory and the device copies them with
// cudaMemcpyAsync on the legacy default stream, where the ops run: in order with the compute, with
// the host free to go on queueing. A region of the ring is written again only after the event
// recorded behind its copy has completed, so a copy never reads bytes of a later upload.
#pragma once
#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "runtime/memory.h"

namespace mt::cuda {

class PinnedUploads : public UploadStaging {
 public:
  // `capacity`: bytes of pinned memory in the ring (an upload larger than that gets a larger ring).
  // `wait`: how the host waits for a region's earlier copy (runtime/device_wait.h; nullptr: it blocks).
  explicit PinnedUploads(size_t capacity = size_t(4) << 20, const DeviceWait* wait = nullptr);
  ~PinnedUploads() override;
  PinnedUploads(const PinnedUploads&) = delete;
  PinnedUploads& operator=(const PinnedUploads&) = delete;

  void upload(void* dst, const void* src, size_t bytes) override;

  size_t capacity() const { return capacity_; }

 private:
  struct InFlight {
    size_t offset, bytes;
    void* done;  // cudaEvent_t recorded behind the copy
  };
  void* reserve(size_t bytes);  // a region no copy in flight still reads
  void retire_front();          // waits for the oldest copy and recycles its event
  void grow(size_t bytes);

  char* ring_ = nullptr;
  size_t capacity_ = 0, head_ = 0;
  const DeviceWait* wait_ = nullptr;
  // Rings outgrown, freed with this one: cudaFreeHost waits for the whole device, which inside a step
  // could mean waiting behind a collective whose peer hung, with no deadline.
  std::vector<char*> outgrown_;
  std::deque<InFlight> in_flight_;  // oldest first, in ring order
  std::vector<void*> spare_events_;
};

// The UploadStaging for device memory (MemOps::make_upload_staging).
std::unique_ptr<UploadStaging> make_pinned_uploads(const DeviceWait* wait);

}  // namespace mt::cuda
