// A per-rank timeline in the Chrome trace format (a JSON object with "traceEvents", which Perfetto
// and chrome://tracing open): complete events ("ph": "X") of ops, communication and pipeline
// actions, each on a named lane (the viewer's thread rows: "step", "ops", "pipeline", "comm dp", ...),
// the process named after the rank. Times are microseconds since the Unix epoch: the system clock
// read once when the trace begins, the steady clock after it; so the files of the ranks on one node
// line up when opened together (across nodes, as well as their clocks agree).
//
// What a span means. Ops: the op's call on the host (on the CPU backend its whole computation; on a
// GPU only the launch: the kernels run later on the stream). Communication: from the call that issued
// it to the moment the caller saw it complete (a blocking call's whole wait; an async one's issue to
// the wait or test that found it done, so a late wait stretches the span). Pipeline: each F, B,
// B_input and W compute action.
//
// Recording is switched on and off (set_recording) so that a run traces a few steps, not all of
// them; at most max_events are kept and the rest counted as dropped. Spans may be added from any
// thread (a mutex), though the trainer adds them from its own.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace mt {

class Trace {
 public:
  using Clock = std::chrono::steady_clock;

  Trace(int rank, std::string process_name, size_t max_events = size_t(1) << 20);

  bool recording() const { return recording_; }
  void set_recording(bool on) { recording_ = on; }

  // The lane called `name` (created on first use; ids in order of creation).
  int lane(const std::string& name);
  // One span [begin, end) on a lane; `args`: a JSON object's text, or empty.
  void add(std::string name, const char* category, int lane, Clock::time_point begin, Clock::time_point end,
           std::string args = {});

  size_t events() const;
  size_t dropped() const;

  // The whole trace as Chrome trace JSON, and written to `path` (through a temporary file renamed
  // into place, so a reader never sees half a trace). Throws mt::Error naming the path on failure.
  std::string json() const;
  void write(const std::string& path) const;

  // A span from construction to destruction, when the trace is non-null and recording.
  class Span {
   public:
    Span(Trace* t, int lane, const char* category, std::string name);
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Trace* t_;
    int lane_;
    const char* category_;
    std::string name_;
    Clock::time_point begin_;
  };

 private:
  struct Event {
    std::string name;
    const char* category;
    int lane;
    int64_t begin_ns, dur_ns;
    std::string args;
  };
  int rank_;
  std::string process_name_;
  size_t max_events_;
  Clock::time_point origin_;
  int64_t origin_epoch_ns_;
  bool recording_ = false;
  mutable std::mutex mu_;
  std::vector<Event> events_;
  std::vector<std::string> lanes_;
  size_t dropped_ = 0;
};

}  // namespace mt
