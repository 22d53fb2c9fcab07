// Stopping a run that has gone wrong: a non-finite loss or gradient norm (outside fp16's skip logic),
// fp16 skipping step after step, or non-finite weights about to be saved. Such a run stops with one
// line naming the step and what went wrong, and with its own exit status, so that a supervisor does
// not relaunch it (resuming from the last checkpoint would only diverge again). Nothing non-finite
// is ever written: the checks run before every save, and the earlier, finite checkpoints are kept.
#pragma once
#include <string>

#include "parallel/comm.h"
#include "runtime/exit_status.h"

namespace mt::train {

struct StepResult;

// Raised by every rank alike: the values judged are reduced over the ranks, or agreed by a collective.
class DivergenceError : public parallel::CollectiveError {
 public:
  explicit DivergenceError(const std::string& what) : CollectiveError(what, kExitDiverged) {}
};

// Judges each step's outcome. fp16 overflow skips a step and halves the loss scale (LossScaler);
// `max_skips` such steps in a row mean the scale cannot fix it (gradients overflow at any scale, or
// the loss is not finite), and the run stops.
class DivergenceGuard {
 public:
  explicit DivergenceGuard(int max_skips) : max_skips_(max_skips) {}
  // "" when the run may go on, else why it must stop. `step` is the step just taken (1-based).
  std::string problem(int step, const StepResult& r, float loss_scale);

 private:
  int max_skips_;
  int skipped_in_a_row_ = 0;
};

}  // namespace mt::train
