// Where a run starts: resume=auto (the newest checkpoint that verifies, else the next older one; a
// fresh start only when there is no checkpoint at all), resume=fresh (step 0 whatever the checkpoint
// directory holds), or a given checkpoint. Checkpoints that exist but do not verify are an error that
// names each of them and touches nothing: starting over beside them would let the new run's saves
// replace and retire them, and a damaged checkpoint's weights are often intact.
#include <filesystem>

#include "runtime/check.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::resume_at_start() {
  if (o_.resume.empty() || o_.resume == "fresh") return;
  if (o_.resume != "auto") {
    load_state(o_.resume);
    return;
  }
  if (!std::filesystem::exists(ckpt_opts_.dir)) return;
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
