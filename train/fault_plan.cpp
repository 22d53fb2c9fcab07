// Fault injection that cannot fire is an error: a fault test that passes without its fault proves
// nothing. Before a run starts, the planned fault (ckpt.fault_*) and bit flip (parallel.sdc_flip_*)
// are checked against the run (its steps, saves, ranks, replicas, the step it resumes at, a marker
// left by an earlier run); after it, a fault that was armed but never fired is reported.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "runtime/check.h"
#include "train/trainer.h"

namespace mt::train {

namespace fs = std::filesystem;

namespace {

bool is_save_phase(const std::string& p) {
  return p == "staging" || p == "write" || p == "before_commit" || p == "after_commit" || p == "enospc" ||
         p == "slow_write";
}

// The problem with the run's fault injection plan that shows without looking at any file, or "".
std::string plan_problem(const config::TrainOptions& o, int world_size, int dp_size) {
  const config::CheckpointOptions& c = o.ckpt;
  if (c.fault_phase.empty()) {
    if (c.fault_step != -1) return strfmt("ckpt.fault_step=%d needs a ckpt.fault_phase", c.fault_step);
  } else {
    if (c.fault_step < 1)
      return strfmt("ckpt.fault_phase=%s needs ckpt.fault_step, a step from 1 to %d", c.fault_phase.c_str(), o.steps);
    if (c.fault_step > o.steps)
      return strfmt("ckpt.fault_step=%d is past the run's last step (steps=%d): the fault can never fire",
                    c.fault_step, o.steps);
    if (c.fault_rank >= world_size)
      return strfmt("ckpt.fault_rank=%d is outside the world of %d rank(s)", c.fault_rank, world_size);
    if (c.fault_rank == checkpoint::Options::kEveryRank && c.fault_phase != "enospc")
      return strfmt("ckpt.fault_rank=-1 (every rank) is for ckpt.fault_phase=enospc only, not %s",
                    c.fault_phase.c_str());
    if ((c.fault_phase == "hang" || c.fault_phase == "straggler") && world_size < 2)
      return strfmt("ckpt.fault_phase=%s needs peers to notice it: run it on 2 or more ranks", c.fault_phase.c_str());
    if (c.fault_phase == "preempt" && c.fault_step == o.steps)
      return strfmt("ckpt.fault_phase=preempt at the last step (%d) would not stop the run: it ends there anyway",
                    o.steps);
    const bool saves = c.fault_step == o.steps || (o.save_every > 0 && c.fault_step % o.save_every == 0);
    if (is_save_phase(c.fault_phase) && !saves)
      return strfmt("ckpt.fault_phase=%s happens during a save, but no checkpoint is saved at step %d (saves: %s, "
                    "and at the last step %d)",
                    c.fault_phase.c_str(), c.fault_step,
                    o.save_every > 0 ? strfmt("every %d steps", o.save_every).c_str() : "save_every=0", o.steps);
  }
  const config::ParallelOptions& p = o.parallel;
  if (p.sdc_flip_step < 0) return "";
  if (p.sdc_every == 0 || p.sdc_flip_step == 0 || p.sdc_flip_step % p.sdc_every != 0 || p.sdc_flip_step > o.steps)
    return strfmt("parallel.sdc_flip_step=%d is not a step with a replica check (sdc_every=%d, steps=%d)",
                  p.sdc_flip_step, p.sdc_every, o.steps);
  if (p.sdc_flip_rank >= world_size)
    return strfmt("parallel.sdc_flip_rank=%d is outside the world of %d rank(s)", p.sdc_flip_rank, world_size);
  if (dp_size < 2 || p.zero == 3)
    return strfmt("parallel.sdc_flip_step=%d: the replica check compares data-parallel replicas, and this run has "
                  "none to compare (dp=%d, zero=%d)",
                  p.sdc_flip_step, dp_size, p.zero);
  return "";
}

}  // namespace

// Collective. The fault is armed once per output directory (the `fault_armed` marker), so that the
// run a supervisor relaunches (with resume=auto) does not fire it again.
void Trainer::check_fault_plan() {
  const std::string why = plan_problem(o_, world_.size(), mesh_->dp());
  if (!why.empty()) throw parallel::CollectiveError(why);
}

void Trainer::arm_fault_injection() {
  std::string why;
  const config::CheckpointOptions& c = o_.ckpt;
  if (c.fault_phase.empty()) return;
  const std::string plan = strfmt("%s step %d rank %d", c.fault_phase.c_str(), c.fault_step, c.fault_rank);
  const bool relaunch = !o_.resume.empty() && o_.resume != "fresh";
  int32_t msg[2] = {0, 0};  // armed, failed
  if (world_.rank() == 0) {
    const fs::path out(o_.out_dir), marker = out / "fault_armed";
    if (fs::exists(marker)) {
      std::string left;
      std::getline(std::ifstream(marker), left);
      if (left != plan)
        why = strfmt("%s is left from an earlier run with another fault (%s): delete it to arm this one (%s)",
                     marker.c_str(), left.c_str(), plan.c_str());
      else if (!relaunch)
        why = strfmt("%s is left from an earlier run: this fault (%s) would not fire again; delete it, or give "
                     "resume=auto to continue that run", marker.c_str(), plan.c_str());
    } else if (c.fault_step <= step_) {
      why = strfmt("ckpt.fault_step=%d can never fire: the run resumes after step %d", c.fault_step, step_);
    } else {
      fs::create_directories(out);
      checkpoint::io::write_file_atomically(marker.string(), plan + "\n");
      msg[0] = 1;
    }
    msg[1] = !why.empty();
  }
  world_.broadcast(msg, 2, DType::i32, 0);
  if (msg[1])
    throw parallel::CollectiveError(world_.rank() == 0 ? why : "fault injection cannot be armed (see rank 0)");
  if (!msg[0]) return;
  ckpt_opts_.fault_phase = c.fault_phase;
  ckpt_opts_.fault_step = c.fault_step;
  ckpt_opts_.fault_rank = c.fault_rank;
}

// At the end of a run: the fault's rank got here, so its fault never fired (a kill ends the process,
// an ENOSPC fails the save). Its rank tells the others; if it is dead, mpirun ends the job first.
void Trainer::check_fault_fired() {
  // A straggler's sleeps and a stalled write do not end their rank: reaching the end is their fault
  // having fired.
  if (ckpt_opts_.fault_phase.empty() || ckpt_opts_.fault_phase == "straggler" || ckpt_opts_.fault_phase == "slow_write")
    return;
  int32_t alive = 1;
  world_.broadcast(&alive, 1, DType::i32, std::max(ckpt_opts_.fault_rank, 0));  // -1: every rank's fault
  throw parallel::CollectiveError(strfmt("the armed fault (ckpt.fault_phase=%s at step %lld on rank %d) never fired",
                                         ckpt_opts_.fault_phase.c_str(), (long long)ckpt_opts_.fault_step,
                                         ckpt_opts_.fault_rank));
}

}  // namespace mt::train
