// Events: a record is a marker queued on the stream; the event is complete once the queue has reached
// its latest record. Waiting on one (cudaEventSynchronize, cudaEventQuery, or work queued behind a
// cudaStreamWaitEvent) runs the work in front of it. Times come from the sim's clock, which advances
// by a fixed step per piece of device work (kOpMs): a count of work, not a timing model.
#include "sim/state.h"

namespace mt::sim::detail {
namespace {

std::shared_ptr<CUevent_st> event_of(Device& d, cudaEvent_t e, const char* call) {
  auto it = d.events.find(e);
  if (it == d.events.end())
    throw CudaError(cudaErrorInvalidResourceHandle,
                    format("%s: event %p is not a live event (never created, or destroyed)", call, (void*)e));
  return it->second;
}

bool complete(const CUevent_st& e) { return !e.recorded || e.done_seq == e.seq; }

}  // namespace
}  // namespace mt::sim::detail

using namespace mt::sim;
using namespace mt::sim::detail;

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  return api([&](Device& d) {
    if (!event) throw CudaError(cudaErrorInvalidValue, "cudaEventCreateWithFlags: event is null");
    if (flags & ~unsigned(cudaEventBlockingSync | cudaEventDisableTiming))
      throw CudaError(cudaErrorInvalidValue,
                      format("cudaEventCreateWithFlags: flags 0x%x not simulated (cudaEventBlockingSync and "
                             "cudaEventDisableTiming are)",
                             flags));
    auto e = std::make_shared<CUevent_st>();
    e->flags = flags;
    d.events[e.get()] = e;
    *event = e.get();
    return cudaSuccess;
  });
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

// A record still queued stays valid: the marker holds the event until it runs.
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  return api([&](Device& d) {
    event_of(d, event, "cudaEventDestroy");
    d.events.erase(event);
    return cudaSuccess;
  });
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return api([&](Device& d) {
    auto e = event_of(d, event, "cudaEventRecord");
    auto s = stream_of(d, stream, "cudaEventRecord");
    Op op;
    op.seq = next_seq(d);
    op.what = "cudaEventRecord";
    op.device = false;
    op.run = [e, seq = op.seq, &d] {
      if (e->seq != seq) return;  // re-recorded since: the later record decides
      e->done_seq = seq;
      e->time_ms = d.clock_ms;
    };
    e->recorded = true;
    e->stream = s;
    e->seq = op.seq;
    push(d, s, std::move(op));
    return cudaSuccess;
  });
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return api([&](Device& d) {
    auto e = event_of(d, event, "cudaEventSynchronize");
    if (!complete(*e)) require_reached(d, run_until(d, e->stream, e->seq), "cudaEventSynchronize");
    return d.sticky;
  });
}

// Runs the work in front of the event, so the answer is "not ready" only behind a held op (sim.h
// enqueue_held): lazily run work has no other moment at which it would finish.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  return api([&](Device& d) {
    auto e = event_of(d, event, "cudaEventQuery");
    if (!complete(*e) && !run_until(d, e->stream, e->seq) && d.sticky == cudaSuccess) return cudaErrorNotReady;
    return d.sticky;
  });
}

// Does not wait: an event whose work has not run is "not ready", as on the hardware.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  return api([&](Device& d) {
    if (!ms) throw CudaError(cudaErrorInvalidValue, "cudaEventElapsedTime: ms is null");
    auto a = event_of(d, start, "cudaEventElapsedTime");
    auto b = event_of(d, end, "cudaEventElapsedTime");
    for (const auto& e : {a, b}) {
      if (e->flags & cudaEventDisableTiming)
        throw CudaError(cudaErrorInvalidResourceHandle,
                        format("cudaEventElapsedTime: event %p was created with cudaEventDisableTiming",
                               (void*)e.get()));
      if (!e->recorded)
        throw CudaError(cudaErrorInvalidResourceHandle,
                        format("cudaEventElapsedTime: event %p was never recorded", (void*)e.get()));
      if (!complete(*e))
        throw CudaError(cudaErrorNotReady,
                        format("cudaEventElapsedTime: event %p has not completed (synchronise on it first)",
                               (void*)e.get()));
    }
    *ms = float(b->time_ms - a->time_ms);
    return cudaSuccess;
  });
}

// Work queued on `stream` after this call runs after the event's record; an event never recorded
// orders nothing, as on the hardware.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  return api([&](Device& d) {
    auto s = stream_of(d, stream, "cudaStreamWaitEvent");
    auto e = event_of(d, event, "cudaStreamWaitEvent");
    if (flags != cudaEventWaitDefault)
      throw CudaError(cudaErrorInvalidValue,
                      format("cudaStreamWaitEvent: flags 0x%x not simulated (cudaEventWaitDefault is)", flags));
    if (complete(*e)) return cudaSuccess;
    Op op;
    op.seq = next_seq(d);
    op.what = "cudaStreamWaitEvent";
    op.device = false;
    op.deps.push_back({e->stream, e->seq});
    push(d, s, std::move(op));
    return cudaSuccess;
  });
}
