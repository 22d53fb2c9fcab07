// The simulated device's state and the helpers its stand-ins share; for sim/ only.
//
// The whole device is one object (Device, reached through device()): the CUDA runtime it stands in
// for is process-wide state, so the sim is too, in one place and behind one lock. What is per host
// thread in the real runtime (the last error) is per thread here (ThreadState).
#pragma once
#include <signal.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sim/sim.h"

namespace mt::sim::detail {

// The H200 the sim reports (sim/device.cpp has the rest of its properties).
constexpr size_t kTotalMemory = 143771287552;
constexpr size_t kSharedDefault = 49152;   // dynamic shared memory per block without opting in
constexpr size_t kSharedOptin = 232448;    // the most a kernel may opt in to
constexpr double kOpMs = 1e-3;             // simulated time of one piece of device work

enum class Kind { device, pinned };

// One allocation. A device block's bytes end at the end of its pages (rounded up to 256 bytes), so
// an overrun reaches the inaccessible page after them.
struct Block {
  uintptr_t base = 0;
  size_t bytes = 0;
  const char* call = "";         // the allocating call: cudaMalloc, cudaMallocAsync, cudaHostAlloc...
  Kind kind = Kind::device;
  uintptr_t pages = 0;           // device: the first page of the block
  size_t page_bytes = 0;         // device: its pages' extent
  bool free_queued = false;      // cudaFreeAsync queued, not yet reached
  const char* freed_by = nullptr;  // set once freed (the freed history)
};

// A dependency: everything queued on `stream` up to and including sequence number `seq`.
struct Dep {
  std::shared_ptr<CUstream_st> stream;
  uint64_t seq = 0;
};

// A piece of queued work. Markers (event records, waits) have device == false: they take no time
// and need no access to device memory.
struct Op {
  uint64_t seq = 0;  // issue order over all streams
  std::string what;
  std::function<void()> run;
  std::vector<Dep> deps;  // must have run first (cross-stream order)
  bool device = true;
  // Empty: the op can run once its deps have. Otherwise it is held while this returns false (work
  // that waits on the device for something that may never come: a collective whose peers hang).
  std::function<bool()> ready;
};

}  // namespace mt::sim::detail

// The runtime's handle types point to these (driver_types.h declares them without a body).
struct CUstream_st {
  unsigned flags = 0;     // cudaStreamDefault (blocking) or cudaStreamNonBlocking
  bool legacy = false;    // the legacy default stream
  std::deque<mt::sim::detail::Op> pending;
};

struct CUevent_st {
  unsigned flags = 0;
  bool recorded = false;
  std::shared_ptr<CUstream_st> stream;  // of the latest record
  uint64_t seq = 0;                     // the latest record's marker
  uint64_t done_seq = 0;                // the marker that last ran: complete when equal to seq
  double time_ms = 0;                   // the simulated clock when it ran
};

struct CUmemPoolHandle_st {
  uint64_t release_threshold = 0;
};

namespace mt::sim::detail {

class Device {
 public:
  Device();

  std::recursive_mutex mutex;

  // memory (sim/memory.cpp, sim/guard.cpp)
  uintptr_t region = 0, region_end = 0, next = 0;  // the reserved device range and its bump pointer
  std::map<uintptr_t, Block> blocks;               // live blocks by base
  std::map<uintptr_t, Block> freed;                // recently freed device blocks, for messages
  std::deque<uintptr_t> freed_order;
  size_t device_bytes = 0;                         // live device bytes
  int access_depth = 0;                            // open DeviceAccess scopes
  struct sigaction previous_segv {};
  CUmemPoolHandle_st pool;

  // streams and events (sim/streams.cpp, sim/events.cpp)
  std::shared_ptr<CUstream_st> legacy;
  std::map<CUstream_st*, std::shared_ptr<CUstream_st>> streams;             // created and live
  std::map<std::thread::id, std::shared_ptr<CUstream_st>> per_thread;       // cudaStreamPerThread
  std::vector<std::shared_ptr<CUstream_st>> retired;  // destroyed with work still queued
  std::map<CUevent_st*, std::shared_ptr<CUevent_st>> events;
  uint64_t seq = 0;
  double clock_ms = 0;
  bool eager = false;
  const std::string* running = nullptr;  // the op running now (for the fault handler's message)
  std::string held;                      // the held op that stopped the latest run (enqueue_held)
  uint64_t device_syncs = 0;             // device-wide waits so far (device_synchronizations)

  // errors and launches (sim/errors.cpp, sim/device.cpp)
  cudaError_t sticky = cudaSuccess;
  std::map<const void*, size_t> max_dynamic_shared;  // cudaFuncSetAttribute, per kernel
};

// The one device; created on first use and never destroyed (static destructors may still call the
// runtime, e.g. a global's cudaFree).
Device& device();

struct ThreadState {
  cudaError_t last_error = cudaSuccess;
  std::string last_message;
  bool in_device_work = false;  // this thread runs queued device work now
};
ThreadState& this_thread();

using mt::sim::format;

// Runs the body of a stand-in under the device's lock: the sticky error first (unless the call is one
// that answers regardless), then the body; a CudaError it throws becomes the return value (report).
template <class F>
cudaError_t api(F&& body, bool check_sticky = true) {
  Device& d = device();
  std::lock_guard lock(d.mutex);
  if (check_sticky && d.sticky != cudaSuccess) return d.sticky;
  try {
    return body(d);
  } catch (const CudaError& e) {
    return report(e);
  } catch (const std::bad_alloc&) {
    return report(CudaError(cudaErrorMemoryAllocation, "host memory exhausted"));
  }
}

// The code of a bad address: cudaErrorInvalidValue at the API, cudaErrorIllegalAddress in device work.
cudaError_t bad_address_code();

// memory
size_t page_size();
const Block* live_block(const void* p);               // the live block holding p, if any
// What address a is ("pageable host memory", "12 bytes past the end of the cudaMalloc'd block of
// 64 bytes at 0x..."), written into buf without allocating: the fault handler uses it too.
void describe_into(char* buf, size_t n, uintptr_t a);
std::string describe(const void* p);
void check_device_range(const void* p, size_t n, const char* call, const char* what);
void check_host_range(const void* p, size_t n, const char* call, const char* what);
void* allocate(Device& d, size_t bytes, Kind kind, const char* call);
void release(Device& d, uintptr_t base, const char* by);  // the block at base, live
void release_all(Device& d);
void reserve_region(Device& d);
void set_access(const Block& b, bool open);           // mprotect its pages
void install_fault_handler(Device& d);

// streams
std::shared_ptr<CUstream_st> stream_of(Device& d, cudaStream_t s, const char* call);
uint64_t next_seq(Device& d);
void push(Device& d, const std::shared_ptr<CUstream_st>& s, Op op);  // op.seq from next_seq
// Runs the work on s up to seq, and first whatever it depends on; run_all runs everything, in issue
// order. Both stop at the first failure, which becomes the sticky error, and at a held op (Op::ready):
// then they return false and d.held names it.
bool run_until(Device& d, const std::shared_ptr<CUstream_st>& s, uint64_t seq);
bool run_all(Device& d);
// For a call that blocks the host on the hardware, after its run: a run stopped by a held op would
// block forever there, so the call fails instead (cudaErrorLaunchTimeout, naming itself and the op).
void require_reached(Device& d, bool reached, const char* call);
bool done(const Dep& dep);
void drop_all_work(Device& d);

}  // namespace mt::sim::detail
