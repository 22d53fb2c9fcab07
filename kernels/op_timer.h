// Per-op timing for profiling runs (`minitrain bench profile_ops=1`): every op dispatched through
// kernels/ops.cpp with a timer in its Ctx is bracketed by two marks, and the totals per op name give
// where a step's time goes. On the CPU a mark is a clock reading; on a GPU it is a CUDA event recorded
// on the op's stream, so the time is the device's time for the op's kernels (resolved, with one
// synchronisation, when the totals are read). An op that carries a FLOP count (the matmuls and the
// attention products) reports its achieved rate too, and every op carries the least number of bytes it
// must move to and from memory (each input read once, each output written once), so a table can set
// its time against the device's memory bandwidth as well as its FLOP rate.
//
// Host regions (runtime/regions.h) are timed by the same marks: the work a step does between its ops,
// named. Regions nest and may hold ops; a region's time is its own, what the ops and regions inside it
// took left out, so that ops and regions together add up to the time they cover.
//
// Marks cost little but not nothing (an event record per mark on a GPU): timed runs are for finding
// the expensive ops, and the untimed run's tokens/s stay the figure to quote.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace mt::ops {

struct OpTotal {
  std::string op;
  long calls = 0;
  double seconds = 0;
  double flops = 0;  // summed over the calls (0 for ops without a count)
  double bytes = 0;  // least memory traffic, summed over the calls
  bool region = false;  // a host region: its own time, without the ops and regions inside it
};

class OpTimer {
 public:
  virtual ~OpTimer() = default;
  // Brackets one op (op: a string that outlives the timer, e.g. __func__). Not nested.
  void begin(const char* op, double flops, double bytes = 0);
  void end();
  // Brackets a host region (name: as op). A region begun inside an op is part of the op: not recorded.
  void begin_region(const char* name);
  void end_region();
  // Totals per op and per region since the last reset, in order of first appearance.
  std::vector<OpTotal> totals();
  void reset();

 protected:
  virtual size_t mark() = 0;                               // a new mark, numbered from 0 since the last clear
  virtual double seconds_between(size_t a, size_t b) = 0;  // may wait for a device
  virtual void clear_marks() = 0;

 private:
  struct Record {
    const char* op;
    double flops, bytes;
    size_t begin, end;
    long parent;  // the innermost region open when it began (an index into records_), or -1
    bool region;
  };
  long innermost() const { return open_regions_.empty() ? -1 : open_regions_.back(); }
  std::vector<Record> records_;
  std::vector<long> open_regions_;  // indices into records_, outermost first
  int regions_in_op_ = 0;           // regions begun inside the open op, not recorded
  const char* open_op_ = nullptr;
  double open_flops_ = 0, open_bytes_ = 0;
  size_t open_mark_ = 0;
};

// Wall-clock marks (the CPU backend).
std::unique_ptr<OpTimer> make_host_timer();

}  // namespace mt::ops
