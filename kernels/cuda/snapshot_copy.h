// Device-to-host copies for a checkpoint's snapshot (checkpoint/checkpointer.h, StagingHooks) that can
// overlap the next step: they run on a stream of their own, behind an event recorded on the compute
// stream when the save was asked for. A blocking cudaMemcpy on the legacy default stream, which the
// compute uses too, would wait behind the next step's kernels and hold them up in turn.
#pragma once
#include <cstddef>

namespace mt::cuda {

class SnapshotCopier {
 public:
  // Made on the thread whose current device the run uses; `compute_stream` is the ops' stream.
  explicit SnapshotCopier(void* compute_stream);
  ~SnapshotCopier();
  SnapshotCopier(const SnapshotCopier&) = delete;
  SnapshotCopier& operator=(const SnapshotCopier&) = delete;

  // The save's moment: an event on the compute stream after the work queued so far (the caller's thread).
  void mark();
  // dst (pinned host memory) = src (device), as of the last mark; returns when the bytes are there.
  // May run on another thread than mark(), but not at the same time as the next mark().
  void copy(void* dst, const void* src, size_t bytes);

 private:
  int device_ = 0;
  void* compute_ = nullptr;  // cudaStream_t
  void* stream_ = nullptr;   // cudaStream_t: non-blocking, so the legacy stream's work does not order it
  void* marked_ = nullptr;   // cudaEvent_t
};

}  // namespace mt::cuda
