// The simulated CUDA device: checked stand-ins for the CUDA runtime, linked in place of libcudart
// when MT_CUDA_SIM=ON, so the project's CUDA host code runs, and is checked, without a GPU. Nothing
// in the product includes this header; the sim's own later pieces (kernel launches over the warp
// emulator, cuBLASLt, NCCL) and its tests do.
//
// Who holds what:
//   device memory   a reserved address range of its own (mmap), one block per allocation, each
//                   ending at a page end (256-byte aligned) with an inaccessible page after it;
//                   addresses are not reused, so a use after free is always caught. Its pages are
//                   PROT_NONE except while device work runs (DeviceAccess): host code that reads or
//                   writes device memory dies with one line naming the block.
//   the registry    every live allocation (base, size, allocating call; device or pinned host), and
//                   the recently freed ones for messages. Any other address is pageable host memory.
//   streams         in-order queues of work that run only when something waits for them (a
//                   synchronise, an event query, a copy to pageable host memory, work behind a
//                   cudaStreamWaitEvent), so a missing synchronisation reads stale data, the same
//                   stale data on every run. The legacy default stream (0, cudaStreamLegacy) waits
//                   for, and is waited for by, every blocking stream, as on the hardware; streams
//                   created with cudaStreamNonBlocking are not.
//   errors          each stand-in returns the code the real runtime would; a failure is recorded as
//                   the calling thread's last error (cudaGetLastError) with a message (last_message)
//                   and printed as one line, except the answers callers handle (out of memory, not
//                   ready). A failure inside queued work is sticky, as a kernel fault is: every later
//                   call returns it until cudaDeviceReset.
//
// The sim stands in for a vendor library that is process-wide state by nature (one device, one
// context); that state is one object (sim/state.h), behind one lock. The device is an H200: 132 SMs,
// compute capability 9.0, 143771287552 bytes, 48 KiB of dynamic shared memory per block by default
// and 227 KiB (232448 bytes) opted in.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace mt::sim {

// What the sim's checks throw: the code the real runtime would return, and a message naming the call
// and the argument. Stand-ins catch it and return the code (report).
class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

// printf into a std::string: the messages of the sim and of its stand-ins.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Records e as the calling thread's last error and message, prints its line (unless it is an answer
// callers handle: out of memory, not ready) and returns its code: how a stand-in fails.
cudaError_t report(const CudaError& e);

// The calling thread's most recent failure message ("" if none since the last cudaDeviceReset).
std::string last_message();

// True when [p, p + bytes) lies inside one live device allocation (bytes 0: p itself does).
bool is_device(const void* p, size_t bytes);

// Throws CudaError unless [p, p + bytes) lies inside one live device allocation; the message names
// `call`, the argument `what` and what p is instead (host memory, a freed block, past a block's end).
// The code is cudaErrorInvalidValue at the API, cudaErrorIllegalAddress inside device work.
void require_device(const void* p, size_t bytes, const char* call, const char* what);

// Opens device memory to the host for its lifetime (nested scopes are counted): the sim holds one
// while it runs queued device work. Process-wide: host code on another thread is not caught meanwhile.
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

// Queues `work` on stream s (0, cudaStreamLegacy, cudaStreamPerThread or a created stream) behind the
// work already there; it runs inside a DeviceAccess when something waits for it. A CudaError or other
// exception it throws becomes the sticky error of the synchronising call (in eager mode, of the next
// call), its message naming `what`.
// Throws CudaError (cudaErrorInvalidResourceHandle) for a stream that is not live, or the sticky
// error if the device already failed.
void enqueue(cudaStream_t s, std::string what, std::function<void()> work);

// Queues `work` on s as enqueue does, then runs s up to and including it (first the work it depends on:
// earlier work on s, and on other streams through events or the legacy default stream), so `work` sees
// exactly the data produced by the work ordered before it. For stand-ins whose work cannot wait for the
// host to come back later (NCCL's: a peer process waits for it). A failure inside it, or inside the
// work it waited for, follows enqueue's rules (reported, sticky) and is thrown again here as the sticky
// CudaError. With an empty `work` it only checks that s is live and the device has not failed.
void run_now(cudaStream_t s, std::string what, std::function<void()> work);

// Queues on s an op that is held, neither run nor complete, until `released()` returns true: device
// work that waits for something that may never come (a collective whose peers hang; the NCCL stand-in
// holds one on request, sim/nccl_hold.h). Work ordered after it waits too. cudaEventQuery behind it
// answers cudaErrorNotReady; a call that would block the host behind it on a GPU (a synchronise, a
// copy to pageable memory, cudaFree, an NCCL call's run_now) would wait forever there, so here it
// fails at once with cudaErrorLaunchTimeout naming the op: a host wait that polls under a deadline is
// the only way past it. `released` is asked under the device's lock.
void enqueue_held(cudaStream_t s, std::string what, std::function<bool()> released);

// Eager mode, a debugging aid: every call runs its work at once instead of when waited for, so a
// result that changes with MT_SIM_EAGER=1 points at a missing synchronisation. The environment
// variable MT_SIM_EAGER=1 turns it on for the process (read once, announced on stderr); set_eager
// overrides it. Turning it on runs the work already queued.
void set_eager(bool on);
bool eager();

// The launch checks of the hardware for <<<grid, block, dyn_smem>>> of `kernel` (its name, for the
// message; `func` its address, whose cudaFuncSetAttribute limits apply): at most 1024 threads and
// 1024 x 1024 x 64 per block, grid x <= 2^31 - 1, y and z <= 65535, no dimension 0, dynamic shared
// memory <= 48 KiB unless cudaFuncAttributeMaxDynamicSharedMemorySize raised it (to at most 232448).
// A violation returns cudaErrorInvalidConfiguration (dimensions) or cudaErrorInvalidValue (shared
// memory) and stays the thread's last error until cudaGetLastError reads it, as a failed launch does.
cudaError_t check_launch(const char* kernel, dim3 grid, dim3 block, size_t dyn_smem, const void* func);

// How many times the process has asked the simulated cuBLASLt's heuristic (cublasLtMatmulAlgoGetHeuristic),
// successful or not: what a test of the project's plan cache counts.
uint64_t lt_heuristic_calls();

// How many calls of the process have waited for the whole device: cudaDeviceSynchronize, and
// cudaFree and cudaFreeHost of a block (which synchronise the device implicitly, as on the hardware).
// What a test that the training step waits on streams, never on the whole device, counts.
uint64_t device_synchronizations();

}  // namespace mt::sim
