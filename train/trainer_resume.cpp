// Where a run starts: resume=auto (the newest checkpoint that verifies, else the next older one; a
// fresh start only when there is no checkpoint at all), resume=fresh (step 0 whatever the checkpoint
// directory holds), or a given checkpoint. Checkpoints that exist but do not verify are an error that
// names each of them and touches nothing: starting over beside them would let the new run's saves
// replace and retire them, and a damaged checkpoint's weights are often intact. Whatever writes to
// the run's directories first locks them (one run per directory). A checkpoint resumed under other
// settings says what changed and carries over only what still applies (global batch, loss scale).
#include <cstdio>
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

std::string Trainer::choose_resume() {
  namespace fs = std::filesystem;
  if (o_.resume.empty() || o_.resume == "fresh") return "";
  if (o_.resume != "auto") {
    if (fs::exists(fs::path(o_.resume) / checkpoint::kManifestName)) return o_.resume;
    const auto found = checkpoint::find_latest_valid(o_.resume, world_, ckpt_opts_.log);  // a root
    if (!found) fail("resume: no valid checkpoint in '%s'", o_.resume.c_str());
    return found->path;
  }
  if (!fs::exists(ckpt_opts_.dir)) return "";
  lock_run_dirs(false);  // before the scan: another run's save or retention would change what it sees
  std::optional<checkpoint::Found> found;
  try {
    found = checkpoint::find_latest_valid(ckpt_opts_.dir, world_, ckpt_opts_.log);
  } catch (const parallel::CollectiveError& e) {
    throw parallel::CollectiveError(strfmt("resume=auto: %s; nothing was changed: repair or move them, or give "
                                           "resume=fresh to start over beside them",
                                           e.what()));
  }
  return found ? found->path : "";
}

// The global batch (dp x batch_size x grad_accum rows) sets the optimisation; a run resumed on fewer
// or more data-parallel ranks would change it silently. The saved one is kept as if given as
// global_batch, so batch_size follows (grad_accum stays); a user who sets global_batch chooses.
void Trainer::keep_saved_global_batch(const std::string& ckpt_path) {
  if (o_.global_batch > 0) return;
  const nlohmann::json meta = checkpoint::read_manifest(ckpt_path).meta;
  if (!meta.contains("global_batch")) return;  // saved before it was recorded
  const int saved = meta.at("global_batch"), saved_dp = meta.at("layout").at("dp"), dp = mesh_->dp();
  if (saved_dp == dp || saved == dp * o_.batch_size * o_.grad_accum) return;
  if (saved % (dp * o_.grad_accum) != 0)
    throw parallel::CollectiveError(strfmt(
        "%s was trained with a global batch of %d rows on dp %d; on dp %d x grad_accum %d it cannot be kept: "
        "give global_batch=N (a multiple of %d) or another grad_accum",
        ckpt_path.c_str(), saved, saved_dp, dp, o_.grad_accum, dp * o_.grad_accum));
  if (world_.rank() == 0)
    std::fprintf(stderr,
                 "minitrain: %s was trained with a global batch of %d rows on dp %d; keeping it on dp %d: "
                 "batch_size %d -> %d (give global_batch=N to change it)\n",
                 ckpt_path.c_str(), saved, saved_dp, dp, o_.batch_size, saved / (dp * o_.grad_accum));
  o_.global_batch = saved;
}

namespace {
const char* precision_name(const std::string& dtype) {
  return dtype == "f32" ? "fp32" : dtype == "bf16" ? "bf16" : dtype == "f16" ? "fp16" : "an unknown precision";
}
}  // namespace

// Master weights and AdamW moments are fp32 in every precision, so they carry over; the loss scale
// belongs to fp16 alone. A run that was not fp16 saved a scale of 1, which would start an fp16 run
// far below its range (every gradient underflowing): it starts at loss_scale.init instead.
void Trainer::restore_loss_scale(const nlohmann::json& meta, const std::string& ckpt_path) {
  const std::string now = dtype_name(o_.precision), saved = meta.value("precision", now);
  if (saved == now) {
    scaler_.restore(meta.at("loss_scale"), meta.at("loss_scale_clean"));
    return;
  }
  if (world_.rank() != 0) return;
  std::string what = "fp32 master weights and AdamW moments carry over";
  if (o_.precision == DType::f16)
    what += strfmt("; the loss scale starts at loss_scale.init %g (not the saved %g)", double(scaler_.scale()),
                   meta.at("loss_scale").get<double>());
  else if (saved == "f16")
    what += strfmt("; the saved loss scale (%g) no longer applies", meta.at("loss_scale").get<double>());
  std::fprintf(stderr, "minitrain: %s was saved in %s, resuming in %s: %s\n", ckpt_path.c_str(),
               precision_name(saved), precision_name(now), what.c_str());
}

}  // namespace mt::train
