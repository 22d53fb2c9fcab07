// Stragglers: a rank that is slower than its peers, step after step. Its slowness does not show in its
// own step time alone (every rank's step ends at the same collective), so each rank measures its busy
// time: the step's wall time less the time it spent blocked waiting on peers (Comm::blocked_seconds,
// counted by the wait loop of parallel/comm.h). The ranks all-gather it once per step (one float per
// rank over the world, after the step's own timing), and a rank whose busy time exceeds
// dist.straggler_ratio x the median, and by at least kStragglerMinGap, is named in the progress line
// and metrics.jsonl ("straggler": {"rank": R, "ratio": x}); the run summary lists the slowest ranks.
// The gap keeps the operating system out of it: on sub-millisecond toy steps a rank descheduled for
// a few tens of ms is 30-40x the median (measured: a 2-rank run of 0.55 ms steps on a loaded 2-core
// host named a rank in 82 of 300 steps without the gap), while a real straggler loses far more.
//
// The median is the lower median (element floor((n-1)/2) of the sorted times): with two ranks it is the
// faster one, so a lone slow rank stands out however few ranks there are. Default threshold 1.5: a
// rank half as slow again as the typical one, well above the step-to-step noise of a healthy run
// (a few percent on a GPU, ~20% on a loaded CPU); under pipeline parallelism the stages' own
// imbalance counts too (pp.layers balances them by FLOPs), so a run with uneven stages may raise it.
// Fault injection (ckpt.fault_phase=straggler, ckpt.fault_rank=R, ckpt.fault_step=S): rank R sleeps
// kStragglerDelay before each step from step S on; ckpt.fault_phase=hang: rank R stops itself
// (SIGSTOP) before step S, as a hung process would (train/fault_plan.cpp arms both).
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace mt::train {

constexpr std::chrono::milliseconds kStragglerDelay{100};
constexpr double kStragglerMinGap = 0.05;  // seconds a named rank's busy time exceeds the median by

struct StragglerVerdict {
  int rank = -1;         // the rank with the longest busy time
  double ratio = 0;      // its busy time / the median's
  double median_s = 0;   // the median busy time
  double max_s = 0;      // its busy time
  bool straggler = false;  // ratio > threshold and max_s - median_s >= kStragglerMinGap (threshold 0: never)
};

// The verdict on one step from every rank's busy seconds (index = world rank).
StragglerVerdict judge_stragglers(const std::vector<double>& busy_s, double threshold);

// Over a run: each rank's mean ratio to the median and the steps it was named in.
class StragglerTally {
 public:
  void add(const std::vector<double>& busy_s, const StragglerVerdict& v);
  // The `n` slowest ranks by mean ratio, e.g. "rank 1 x3.10 (named in 7 of 8 steps), rank 0 x1.00";
  // "" before any step.
  std::string slowest(size_t n) const;

 private:
  std::vector<double> ratio_sum_;
  std::vector<int> named_;
  int steps_ = 0;
};

}  // namespace mt::train
