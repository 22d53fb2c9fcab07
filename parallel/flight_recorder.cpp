#include "parallel/flight_recorder.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "parallel/comm.h"

namespace mt::parallel {

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

const char* op_state_name(OpState s) {
  static const char* names[] = {"issued", "completed", "timed_out"};
  return names[int(s)];
}

uint64_t FlightRecorder::issue(const char* op, uint64_t bytes, int dst, int src) {
  const uint64_t seq = next_++;
  ring_[seq % kCapacity] = CommRecord{seq, op, bytes, dst, src, wall_seconds(), 0, OpState::issued};
  return seq;
}

void FlightRecorder::end(uint64_t seq, OpState state) {
  CommRecord& r = ring_[seq % kCapacity];
  if (r.seq != seq) return;
  r.ended = wall_seconds();
  r.state = state;
}

std::vector<CommRecord> FlightRecorder::records() const {
  std::vector<CommRecord> out;
  const uint64_t first = next_ > kCapacity ? next_ - kCapacity : 1;
  for (uint64_t s = first; s < next_; s++) out.push_back(ring_[s % kCapacity]);
  return out;
}

std::string flight_records_jsonl(const Comm& comm) {
  std::string out;
  for (const CommRecord& r : comm.flight_recorder().records()) {
    nlohmann::ordered_json j = {{"group", comm.name()}, {"rank", comm.rank()}, {"size", comm.size()}, {"seq", r.seq},
                        {"op", r.op}, {"bytes", r.bytes}};
    if (r.dst >= 0) j["to"] = r.dst;
    if (r.src >= 0) j["from"] = r.src;
    j["issued"] = r.issued;
    j["ended"] = r.ended > 0 ? nlohmann::ordered_json(r.ended) : nlohmann::ordered_json();
    j["state"] = op_state_name(r.state);
    out += j.dump() + "\n";
  }
  return out;
}

}  // namespace mt::parallel
