// Where a run starts: resume=auto (the newest checkpoint that verifies, else the next older one; a
// fresh start only when there is no checkpoint at all), resume=fresh (step 0 whatever the checkpoint
// directory holds), or a given checkpoint. Checkpoints that exist but do not verify are an error that
// names each of them and touches nothing: starting over beside them would let the new run's saves
// replace and retire them, and a damaged checkpoint's weights are often intact. Whatever writes to
// the run's directories first locks them (one run per directory).
#include <filesystem>

#include "runtime/check.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::lock_run_dirs(bool create) {
  namespace fs = std::filesystem;
  std::string why;
  if (world_.rank() == 0) try {
    if (!out_lock_.held() && (create || fs::is_directory(o_.out_dir))) {
      fs::create_directories(o_.out_dir);
      out_lock_ = DirLock(o_.out_dir, "out_dir");
    }
    // ckpt.dir may be out_dir itself: that lock covers it (a second flock on it would fail).
    const bool same = out_lock_.held() && fs::is_directory(ckpt_opts_.dir) && fs::equivalent(o_.out_dir, ckpt_opts_.dir);
    if (!ckpt_lock_.held() && !same && (create || fs::is_directory(ckpt_opts_.dir))) {
      fs::create_directories(ckpt_opts_.dir);
      ckpt_lock_ = DirLock(ckpt_opts_.dir, "ckpt.dir");
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  int32_t failed = !why.empty();
  world_.broadcast(&failed, 1, DType::i32, 0);
  if (failed) throw parallel::CollectiveError(world_.rank() == 0 ? why : "cannot lock the run's directories (see rank 0)");
}

void Trainer::resume_at_start() {
  if (o_.resume.empty() || o_.resume == "fresh") return;
  if (o_.resume != "auto") {
    load_state(o_.resume);
    return;
  }
  if (!std::filesystem::exists(ckpt_opts_.dir)) return;
  lock_run_dirs(false);  // before the scan: another run's save or retention would change what it sees
  std::optional<checkpoint::Found> found;
  try {
    found = checkpoint::find_latest_valid(ckpt_opts_.dir, world_, ckpt_opts_.log);
  } catch (const parallel::CollectiveError& e) {
    throw parallel::CollectiveError(strfmt("resume=auto: %s; nothing was changed: repair or move them, or give "
                                           "resume=fresh to start over beside them",
                                           e.what()));
  }
  if (found) load_checkpoint(found->path);
}

}  // namespace mt::train
