// Streams as in-order queues that run lazily: work runs when something waits for it, and a failure
// inside it becomes the sticky error of the call that waited.
//
// Order between streams is a dependency of the queued op on a prefix of another stream:
//   - cudaStreamWaitEvent queues a marker that depends on the event's record;
//   - the legacy default stream (handle 0 or cudaStreamLegacy): an op queued on it depends on the
//     work queued so far on every blocking stream, and an op queued on a blocking stream depends on
//     the legacy stream's work so far (CUDA Runtime API, "Stream synchronization behavior"). Streams
//     created with cudaStreamNonBlocking take part in neither; the per-thread default stream
//     (cudaStreamPerThread) is a blocking stream.
// Dependencies always point to earlier ops, so running them first terminates.
// run_now queues work and at once runs its stream up to it, for the stand-ins whose work cannot wait to
// be waited for (NCCL's: a peer process is waiting for it).
// Held work (enqueue_held) stops a run where it stands: a query answers not ready, and a call that
// would block the host there on a GPU fails naming it (require_reached) instead of hanging.
#include <algorithm>
#include <cstdint>
#include <optional>

#include "sim/state.h"

namespace mt::sim {
namespace detail {

namespace {

template <class F>
void for_each_stream(Device& d, F f) {
  f(d.legacy);
  for (auto& [h, s] : d.streams) f(s);
  for (auto& [id, s] : d.per_thread) f(s);
  for (auto& s : d.retired) f(s);
}

void fail_device(Device& d, const std::string& what, cudaError_t code, const std::string& why) {
  d.sticky = code;
  drop_all_work(d);  // the context is lost, as after a kernel fault
  report(CudaError(code, format("queued work '%s' failed: %s", what.c_str(), why.c_str())));
}

void execute(Device& d, Op& op, std::optional<DeviceAccess>& access) {
  if (!op.device) {
    if (op.run) op.run();  // a marker: cannot fail
    return;
  }
  if (!access) access.emplace();
  ThreadState& t = this_thread();
  const bool was_in_work = t.in_device_work;
  const std::string* was_running = d.running;
  t.in_device_work = true;
  d.running = &op.what;
  cudaError_t code = cudaSuccess;
  std::string why;
  try {
    op.run();
  } catch (const CudaError& e) {
    code = e.code();
    why = e.what();
  } catch (const std::exception& e) {
    code = cudaErrorLaunchFailure;
    why = e.what();
  }
  t.in_device_work = was_in_work;
  d.running = was_running;
  d.clock_ms += kOpMs;
  if (code != cudaSuccess) fail_device(d, op.what, code, why);
}

// False when a held op (Op::ready) stopped it: that op and everything ordered after it wait.
bool run(Device& d, const std::shared_ptr<CUstream_st>& s, uint64_t seq, std::optional<DeviceAccess>& access) {
  std::vector<Dep> todo{{s, seq}};
  bool reached = true;
  while (!todo.empty() && d.sticky == cudaSuccess) {
    const Dep top = todo.back();
    auto& q = top.stream->pending;
    if (q.empty() || q.front().seq > top.seq) {
      todo.pop_back();
      continue;
    }
    bool blocked = false;
    for (const Dep& dep : q.front().deps) {
      if (!done(dep)) {
        todo.push_back(dep);
        blocked = true;
        break;
      }
    }
    if (blocked) continue;
    if (q.front().ready && !q.front().ready()) {
      d.held = q.front().what;
      reached = false;
      break;
    }
    Op op = std::move(q.front());
    q.pop_front();
    execute(d, op, access);
  }
  std::erase_if(d.retired, [](const auto& r) { return r->pending.empty(); });
  return reached;
}

}  // namespace

std::shared_ptr<CUstream_st> stream_of(Device& d, cudaStream_t s, const char* call) {
  if (s == nullptr || s == cudaStreamLegacy) return d.legacy;
  if (s == cudaStreamPerThread) {
    auto& mine = d.per_thread[std::this_thread::get_id()];
    if (!mine) mine = std::make_shared<CUstream_st>();
    return mine;
  }
  auto it = d.streams.find(s);
  if (it == d.streams.end())
    throw CudaError(cudaErrorInvalidResourceHandle,
                    format("%s: stream %p is not a live stream (never created, or destroyed)", call, (void*)s));
  return it->second;
}

uint64_t next_seq(Device& d) { return ++d.seq; }

bool done(const Dep& dep) { return dep.stream->pending.empty() || dep.stream->pending.front().seq > dep.seq; }

void push(Device& d, const std::shared_ptr<CUstream_st>& s, Op op) {
  auto blocking = [](const std::shared_ptr<CUstream_st>& t) { return !(t->flags & cudaStreamNonBlocking); };
  if (s->legacy) {
    for_each_stream(d, [&](const std::shared_ptr<CUstream_st>& t) {
      if (t != s && blocking(t) && !t->pending.empty()) op.deps.push_back({t, t->pending.back().seq});
    });
  } else if (blocking(s) && !d.legacy->pending.empty()) {
    op.deps.push_back({d.legacy, d.legacy->pending.back().seq});
  }
  // Earliest first: the order in which unordered work runs must not depend on where the heap put
  // the streams.
  std::sort(op.deps.begin(), op.deps.end(), [](const Dep& a, const Dep& b) { return a.seq < b.seq; });
  const uint64_t seq = op.seq;
  s->pending.push_back(std::move(op));
  if (d.eager) run_until(d, s, seq);
}

bool run_until(Device& d, const std::shared_ptr<CUstream_st>& s, uint64_t seq) {
  std::optional<DeviceAccess> access;  // opened once, at the first device work
  return run(d, s, seq, access);
}

bool run_all(Device& d) {
  std::optional<DeviceAccess> access;
  while (d.sticky == cudaSuccess) {
    std::shared_ptr<CUstream_st> first;  // the stream holding the earliest op
    for_each_stream(d, [&](const std::shared_ptr<CUstream_st>& t) {
      if (!t->pending.empty() && (!first || t->pending.front().seq < first->pending.front().seq)) first = t;
    });
    if (!first) break;
    if (!run(d, first, first->pending.front().seq, access)) return false;
  }
  return true;
}

void require_reached(Device& d, bool reached, const char* call) {
  if (reached || d.sticky != cudaSuccess) return;
  throw CudaError(cudaErrorLaunchTimeout,
                  format("%s would block the host forever: queued work '%s' never completes (on a GPU the call "
                         "hangs; poll an event with cudaEventQuery under a deadline instead)",
                         call, d.held.c_str()));
}

void drop_all_work(Device& d) {
  for_each_stream(d, [](const std::shared_ptr<CUstream_st>& t) { t->pending.clear(); });
  d.retired.clear();
}

}  // namespace detail

namespace {

// Queues `work` on s behind what is there (enqueue's rules) and returns its sequence number; with no
// work, only checks that the device has not failed and s is live (0).
uint64_t queue(detail::Device& d, cudaStream_t s, std::string what, std::function<void()> work,
               std::shared_ptr<CUstream_st>* stream) {
  if (d.sticky != cudaSuccess)
    throw CudaError(d.sticky, format("%s: the device already failed (%s)", what.c_str(), cudaGetErrorString(d.sticky)));
  *stream = detail::stream_of(d, s, what.c_str());
  if (!work) return 0;
  detail::Op op;
  op.seq = detail::next_seq(d);
  op.what = std::move(what);
  op.run = std::move(work);
  const uint64_t seq = op.seq;
  detail::push(d, *stream, std::move(op));
  return seq;
}

}  // namespace

void enqueue(cudaStream_t s, std::string what, std::function<void()> work) {
  detail::Device& d = detail::device();
  std::lock_guard lock(d.mutex);
  std::shared_ptr<CUstream_st> stream;
  queue(d, s, std::move(what), std::move(work), &stream);
}

void run_now(cudaStream_t s, std::string what, std::function<void()> work) {
  detail::Device& d = detail::device();
  std::lock_guard lock(d.mutex);
  std::shared_ptr<CUstream_st> stream;
  const std::string call = what;
  const uint64_t seq = queue(d, s, std::move(what), std::move(work), &stream);
  if (seq == 0) return;
  const bool reached = detail::run_until(d, stream, seq);
  if (d.sticky != cudaSuccess) throw CudaError(d.sticky, last_message());
  detail::require_reached(d, reached, call.c_str());
}

void enqueue_held(cudaStream_t s, std::string what, std::function<bool()> released) {
  detail::Device& d = detail::device();
  std::lock_guard lock(d.mutex);
  std::shared_ptr<CUstream_st> stream;
  queue(d, s, what, nullptr, &stream);  // the stream is live and the device has not failed
  detail::Op op;
  op.seq = detail::next_seq(d);
  op.what = std::move(what);
  op.device = false;
  op.run = [] {};
  op.ready = std::move(released);
  detail::push(d, stream, std::move(op));
}

uint64_t device_synchronizations() {
  detail::Device& d = detail::device();
  std::lock_guard lock(d.mutex);
  return d.device_syncs;
}

void set_eager(bool on) {
  detail::Device& d = detail::device();
  std::lock_guard lock(d.mutex);
  d.eager = on;
  if (on) detail::run_all(d);
}

bool eager() {
  detail::Device& d = detail::device();
  std::lock_guard lock(d.mutex);
  return d.eager;
}

}  // namespace mt::sim

using namespace mt::sim;
using namespace mt::sim::detail;

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  return api([&](Device& d) {
    if (!pStream) throw CudaError(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: pStream is null");
    if (flags & ~unsigned(cudaStreamNonBlocking))
      throw CudaError(cudaErrorInvalidValue, format("cudaStreamCreateWithFlags: unknown flags 0x%x", flags));
    auto s = std::make_shared<CUstream_st>();
    s->flags = flags;
    d.streams[s.get()] = s;
    *pStream = s.get();
    return cudaSuccess;
  });
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) { return cudaStreamCreateWithFlags(pStream, cudaStreamDefault); }

// Work still queued on the stream runs later all the same, as on the hardware.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return api([&](Device& d) {
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
      throw CudaError(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: a default stream cannot be destroyed");
    auto s = stream_of(d, stream, "cudaStreamDestroy");
    if (!s->pending.empty()) d.retired.push_back(s);
    d.streams.erase(stream);
    return cudaSuccess;
  });
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return api([&](Device& d) {
    require_reached(d, run_until(d, stream_of(d, stream, "cudaStreamSynchronize"), UINT64_MAX),
                    "cudaStreamSynchronize");
    return d.sticky;
  });
}

cudaError_t cudaDeviceSynchronize(void) {
  return api([](Device& d) {
    d.device_syncs++;
    require_reached(d, run_all(d), "cudaDeviceSynchronize");
    return d.sticky;
  });
}
