// DeviceWait: how the host waits for work it queued on a device.
//
// A host wait on a stream (a synchronise before timing, a copy of the loss to the host) returns when
// the stream's work is done, and on a GPU that work may sit behind a collective whose peer hung: a
// plain blocking wait (cudaEventSynchronize, cudaMemcpy) then waits forever. The CUDA backend records
// an event on the stream and, given a DeviceWait, lets it poll the event (cudaEventQuery) instead of
// blocking. The trainer hands out the Mesh's (parallel/mesh.h), which polls under dist.timeout as every
// wait on peers does: past it, the device communicators are aborted, and the rank ends with one line
// and exit status 4 (hung). Without one (nullptr: a rank with no peers) the backend blocks.
// Host memory has nothing to wait for and never calls it.
#pragma once
#include <functional>

namespace mt {

class DeviceWait {
 public:
  // Returns once `ready()` returns true; may throw (a deadline that passed). `what` names the wait in
  // messages and flight records: a string literal.
  virtual void until(const std::function<bool()>& ready, const char* what) const = 0;

 protected:
  ~DeviceWait() = default;
};

}  // namespace mt
