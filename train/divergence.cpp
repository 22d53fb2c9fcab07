#include "train/divergence.h"

#include <cmath>

#include "runtime/check.h"
#include "train/trainer.h"

namespace mt::train {

namespace {
const char* nonfinite_name(double x) { return std::isnan(x) ? "NaN" : x > 0 ? "inf" : "-inf"; }
}  // namespace

std::string DivergenceGuard::problem(int step, const StepResult& r, float loss_scale) {
  if (r.skipped) {
    if (++skipped_in_a_row_ < max_skips_) return "";
    return strfmt("training diverged at step %d: fp16 skipped %d steps in a row (non-finite gradients even at loss "
                  "scale %g%s); stopping (loss_scale.max_skips=%d)",
                  step, skipped_in_a_row_, double(loss_scale), std::isfinite(r.loss) ? "" : ", non-finite loss",
                  max_skips_);
  }
  skipped_in_a_row_ = 0;
  const bool loss_ok = std::isfinite(r.loss), norm_ok = std::isfinite(r.grad_norm);
  if (loss_ok && norm_ok) return "";
  std::string what;
  if (!loss_ok) what = strfmt("loss (%s)", nonfinite_name(r.loss));
  if (!norm_ok) what += strfmt("%sgradient norm (%s)", what.empty() ? "" : " and ", nonfinite_name(r.grad_norm));
  return strfmt("training diverged at step %d: non-finite %s; stopping without saving it (lower optim.lr, or clip "
                "with optim.grad_clip)",
                step, what.c_str());
}

// Before a save: every rank checks the state it would write (its shard of the master weights and
// AdamW moments), and all agree. A pending save (of an earlier, finite step) is let finish first.
void Trainer::check_state_finite() {
  const int64_t n = dp_->shard_numel();
  int32_t bad = !ops::all_finite(dp_->master_shard(), n, ctx_) || !ops::all_finite(adam_->m(), n, ctx_) ||
                !ops::all_finite(adam_->v(), n, ctx_);
  if (expert_dp_) {  // the experts held apart: their shard and moments too
    const int64_t x = expert_dp_->shard_numel();
    bad = bad || !ops::all_finite(expert_dp_->master_shard(), x, ctx_) || !ops::all_finite(expert_adam_->m(), x, ctx_) ||
          !ops::all_finite(expert_adam_->v(), x, ctx_);
  }
  world_.all_reduce(&bad, 1, DType::i32, parallel::ReduceOp::max);
  if (!bad) return;
  wait_checkpoint();
  throw DivergenceError(strfmt("training diverged: the weights or AdamW moments after step %d hold non-finite "
                               "values; not saving them (the last finite checkpoint is kept)",
                               step_));
}

}  // namespace mt::train
