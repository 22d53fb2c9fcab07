// Where a run starts: resume=auto (the newest checkpoint that verifies, else the next older one; a
// fresh start only when there is no checkpoint at all; with run_id, that run's own first),
// resume=fresh (step 0 whatever the checkpoint directory holds), resume=own (this run's newest
// checkpoint, else step 0), or a given checkpoint. Checkpoints that exist but do not verify are an
// error (a refusal, exit status 2) that names each of them and touches nothing: starting over beside them would let the new run's saves
// replace and retire them, and a damaged checkpoint's weights are often intact. Whatever writes to
// the run's directories first locks them (one run per directory). A checkpoint resumed under other
// settings says what changed and carries over only what still applies (global batch, loss scale).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>

#include "runtime/check.h"
#include "runtime/exit_status.h"
#include "train/trainer.h"

namespace mt::train {

void Trainer::lock_run_dirs(bool create) {
  namespace fs = std::filesystem;
  std::string why;
  if (world_.rank() == 0) try {
    // Creates `dir` (recording each directory made) and locks it.
    auto lock = [&](const std::string& dir, const char* what) {
      std::vector<std::string> made;
      for (fs::path p = fs::absolute(dir); !p.empty() && !fs::exists(p); p = p.parent_path()) made.push_back(p.string());
      fs::create_directories(dir);
      created_dirs_.insert(created_dirs_.end(), made.begin(), made.end());  // innermost first
      const bool had_file = fs::exists(fs::path(dir) / kDirLockName);
      try {
        DirLock l(dir, what);
        if (!had_file) created_dirs_.insert(created_dirs_.begin(), (fs::path(dir) / kDirLockName).string());
        return l;
      } catch (...) {
        if (!had_file) fs::remove(fs::path(dir) / kDirLockName);
        throw;
      }
    };
    if (!out_lock_.held() && (create || fs::is_directory(o_.out_dir))) out_lock_ = lock(o_.out_dir, "out_dir");
    // ckpt.dir may be out_dir itself: that lock covers it (a second flock on it would fail).
    const bool same = out_lock_.held() && fs::is_directory(ckpt_opts_.dir) && fs::equivalent(o_.out_dir, ckpt_opts_.dir);
    if (!ckpt_lock_.held() && !same && (create || fs::is_directory(ckpt_opts_.dir)))
      ckpt_lock_ = lock(ckpt_opts_.dir, "ckpt.dir");
    if (!o_.run_id.empty()) {
      out_lock_.set_run(o_.run_id);
      ckpt_lock_.set_run(o_.run_id);
    }
  } catch (const std::exception& e) {
    why = e.what();
    // A refused run leaves nothing behind: the lock files and directories it made go again.
    out_lock_ = DirLock();
    ckpt_lock_ = DirLock();
    std::error_code ec;
    for (const std::string& p : created_dirs_) fs::remove(p, ec);  // a directory only while empty
    created_dirs_.clear();
  }
  int32_t failed = !why.empty();
  world_.broadcast(&failed, 1, DType::i32, 0);
  if (failed)
    throw parallel::CollectiveError(world_.rank() == 0 ? why : "cannot lock the run's directories (see rank 0)",
                                    kExitRefused);
}

std::string Trainer::choose_resume() {
  namespace fs = std::filesystem;
  if (o_.resume.empty() || o_.resume == "fresh") return "";
  if (o_.resume != "auto" && o_.resume != "own") {
    if (fs::exists(fs::path(o_.resume) / checkpoint::kManifestName)) return o_.resume;
    const auto found = checkpoint::find_latest_valid(o_.resume, world_, ckpt_opts_.log);  // a root
    if (!found) fail("resume: no valid checkpoint in '%s'", o_.resume.c_str());
    return found->path;
  }
  if (!fs::exists(ckpt_opts_.dir)) return "";
  lock_run_dirs(false);  // before the scan: another run's save or retention would change what it sees
  std::optional<checkpoint::Found> found;
  try {
    // This run's own checkpoints first. resume=own stops there (step 0 when there are none: a new
    // run never turns into another run's resume); resume=auto continues the newest of any run.
    if (!o_.run_id.empty()) found = checkpoint::find_latest_valid(ckpt_opts_.dir, world_, ckpt_opts_.log, o_.run_id);
    if (!found && o_.resume == "auto") found = checkpoint::find_latest_valid(ckpt_opts_.dir, world_, ckpt_opts_.log);
  } catch (const parallel::CollectiveError& e) {
    throw parallel::CollectiveError(strfmt("resume=%s: %s; nothing was changed: repair or move them, or give "
                                           "resume=fresh to start over beside them",
                                           o_.resume.c_str(), e.what()),
                                    kExitRefused);
  }
  return found ? found->path : "";
}

void Trainer::settle_run_id(const std::string& resumed_run_id) {
  if (!o_.run_id.empty()) return;
  if (!resumed_run_id.empty()) {
    o_.run_id = resumed_run_id;  // a continued run keeps its identity
    return;
  }
  uint32_t words[2] = {0, 0};
  if (world_.rank() == 0) {
    std::random_device rd;
    words[0] = rd();
    words[1] = rd();
  }
  world_.broadcast(words, 2, DType::i32, 0);
  o_.run_id = strfmt("%08x%08x", words[0], words[1]);
}

// The options that set the optimisation, compared with the ones the checkpoint was saved under: a
// resume that changes them says so ("changed since step 500: optim.lr 0.0003 -> 0.003"). Where the
// run writes, how it logs and the run's bookkeeping are left out.
void Trainer::report_changes(const nlohmann::json& meta, const std::string& ckpt_path) {
  if (world_.rank() != 0 || !meta.contains("config")) return;
  static const char* kIgnored[] = {"/out_dir", "/resume", "/run_id", "/ckpt/", "/log_every", "/threads", "/trace/",
                                   "/profile_ops", "/peak_flops", "/eval_every", "/eval_batches", "/data/prefetch",
                                   "/preempt/", "/mem/", "/dist/", "/init_from", "/parallel/sdc_"};
  auto ignored = [](const std::string& key) {
    for (const char* p : kIgnored)
      if (key.rfind(p, 0) == 0) return true;
    return false;
  };
  auto text = [](const nlohmann::json& v) {
    return v.is_number_float() ? strfmt("%g", v.get<double>()) : v.is_string() ? v.get<std::string>() : v.dump();
  };
  const nlohmann::json was = meta.at("config").flatten(), now = o_.to_json().flatten();
  std::string changes;
  for (auto it = now.begin(); it != now.end(); ++it) {
    if (ignored(it.key())) continue;
    const bool had = was.contains(it.key());
    if (had && text(was[it.key()]) == text(it.value())) continue;
    std::string key = it.key().substr(1);
    std::replace(key.begin(), key.end(), '/', '.');
    changes += strfmt("%s%s %s -> %s", changes.empty() ? "" : ", ", key.c_str(),
                      had ? text(was[it.key()]).c_str() : "(unset)", text(it.value()).c_str());
  }
  if (!changes.empty())
    std::fprintf(stderr, "minitrain: changed since step %d (%s): %s\n", meta.at("step").get<int>(), ckpt_path.c_str(),
                 changes.c_str());
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
        ckpt_path.c_str(), saved, saved_dp, dp, o_.grad_accum, dp * o_.grad_accum), kExitRefused);
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
