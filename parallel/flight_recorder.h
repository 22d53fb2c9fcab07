// FlightRecorder: the last operations of one communicator, kept for the post-mortem of a hang (the
// idea of PyTorch's flight recorder for NCCL process groups, on every backend here).
//
// A bounded ring of records, one per op that has peers to wait for (a one-rank communicator's ops
// complete at once and are not recorded): its sequence number on the communicator (from 1; issued in
// the same order on every rank, so a collective's number names the same op on every rank of the
// group), the op, its payload bytes, the peer ranks of a point-to-point op, when it was issued and
// ended (wall clock, comparable across the ranks of a node), and its state. Recording costs two clock
// reads and a store per op; nothing is written to disk unless a wait times out (Comm::WaitPolicy).
//
// On a timeout the trainer writes every communicator's ring as JSON lines to
// <out_dir>/flight_recorder.rank<R>.jsonl, e.g.
//   {"group":"dp","rank":1,"size":2,"seq":57,"op":"all_reduce","bytes":4096,"issued":1764752400.125,
//    "ended":null,"state":"timed_out"}
// An op still "issued" was never waited for to the end (in flight, or abandoned during the unwinding).
// On a device communicator an op ends when test() saw it finish or wait() ordered the compute stream
// after it (the host does not wait for the device there), so its end time is a lower bound.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mt::parallel {

class Comm;

enum class OpState : uint8_t { issued, completed, timed_out };
const char* op_state_name(OpState s);  // "issued", "completed", "timed_out"

struct CommRecord {
  uint64_t seq = 0;          // 1, 2, ... on its communicator
  const char* op = "";       // "all_reduce", "send_recv", ... (a string literal)
  uint64_t bytes = 0;        // payload
  int dst = -1, src = -1;    // point to point: the ranks sent to and received from (-1: none)
  double issued = 0;         // seconds since the Unix epoch
  double ended = 0;          // 0 while not ended
  OpState state = OpState::issued;
};

class FlightRecorder {
 public:
  static constexpr size_t kCapacity = 64;  // records kept per communicator

  // A new record; returns its sequence number.
  uint64_t issue(const char* op, uint64_t bytes, int dst, int src);
  // Ends record `seq` (nothing if it has left the ring).
  void end(uint64_t seq, OpState state);
  uint64_t last_seq() const { return next_ - 1; }
  std::vector<CommRecord> records() const;  // oldest first

 private:
  CommRecord ring_[kCapacity];
  uint64_t next_ = 1;
};

// One JSON line per record of `comm` (oldest first), each naming the communicator and this rank.
std::string flight_records_jsonl(const Comm& comm);

}  // namespace mt::parallel
