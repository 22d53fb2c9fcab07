// Starting a run as a user relies on it: resume=auto refuses checkpoints that exist but do not
// verify (naming each, touching nothing) instead of starting over beside them; resume=fresh starts
// over on request and still never deletes a damaged checkpoint; a second run on a directory that a
// live run holds fails at once naming the holder, and a killed run's lock never blocks a restart; a
// metrics write that fails stops the run there, leaving only whole records; a resume in another
// precision resets the loss scale.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include "checkpoint/catalog.h"
#include "checkpoint/reader.h"
#include "data/shard.h"
#include "runtime/check.h"
#include "runtime/dir_lock.h"
#include "tests/test_train_util.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

class Recovery : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("mt_recover");
    data_ = testing::write_random_shard(dir_, 64, 100, testing::test_seed());
  }
  void TearDown() override { fs::remove_all(dir_); }

  config::TrainOptions options(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"model=tiny", "model.vocab_size=64", "model.n_layer=1", "model.n_embd=16",
                                     "model.n_head=2", "model.block_size=16", "batch_size=2", "seq_len=16",
                                     "data.path=" + data_, "out_dir=" + run_, "threads=1", "log_every=100"};
    args.insert(args.end(), extra.begin(), extra.end());
    return config::parse_train_options(args);
  }

  // Every file under the run directory with its bytes.
  std::map<std::string, std::string> snapshot() const {
    std::map<std::string, std::string> files;
    // Not the lock files: a run that takes a lock writes its pid, host and run into it (the text a
    // second run's message quotes), as the integration tests' listings leave it out too.
    for (const auto& e : fs::recursive_directory_iterator(run_))
      if (e.is_regular_file() && e.path().filename() != kDirLockName)
        files[e.path().string()] = read_bytes(e.path().string());
    return files;
  }

  std::string dir_, data_, run_ = "";
};

// Flips one byte of tensor data in every rank file of `ckpt`.
void damage(const std::string& ckpt) {
  for (const auto& e : fs::directory_iterator(ckpt)) {
    if (e.path().extension() != ".bin") continue;
    std::string bytes = read_bytes(e.path().string());
    bytes[bytes.size() / 2] ^= 0x20;
    write_bytes(e.path().string(), bytes);
  }
}

TEST_F(Recovery, AutoResumeRefusesWhenNoCheckpointVerifiesAndTouchesNothing) {
  run_ = dir_ + "/run";
  Trainer(options({"steps=4", "save_every=2", "ckpt.keep=0"})).run();
  const std::string ckpts = run_ + "/checkpoints";
  damage(ckpts + "/step_000002");
  damage(ckpts + "/step_000004");
  const auto before = snapshot();
  try {
    Trainer t(options({"steps=8", "save_every=2", "ckpt.keep=1", "resume=auto"}));
    t.run();
    ADD_FAILURE() << "resume=auto started over beside two damaged checkpoints";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("resume=auto: none of the 2 checkpoint(s) in " + ckpts + " verifies"), std::string::npos)
        << what;
    EXPECT_NE(what.find("step_000004 ("), std::string::npos) << what;
    EXPECT_NE(what.find("step_000002 ("), std::string::npos) << what;
    EXPECT_NE(what.find("checksum mismatch"), std::string::npos) << what;
    EXPECT_NE(what.find("resume=fresh"), std::string::npos) << what;
  }
  EXPECT_EQ(snapshot(), before) << "a refused resume changed the run directory";

  // Asked to start over: step 0, and the damaged checkpoints survive its saves and retention (a
  // re-save of their step moves them aside).
  Trainer fresh(options({"steps=8", "save_every=2", "ckpt.keep=1", "resume=fresh"}));
  EXPECT_EQ(fresh.step_count(), 0);
  fresh.run();
  int damaged = 0;
  for (const auto& e : fs::directory_iterator(ckpts))
    if (e.path().filename().string().find(".damaged-") != std::string::npos) damaged++;
  EXPECT_EQ(damaged, 2) << "a damaged checkpoint was deleted";
  EXPECT_NO_THROW(checkpoint::verify(ckpts + "/step_000008"));
  EXPECT_FALSE(fs::exists(ckpts + "/step_000006")) << "retention kept more than ckpt.keep=1";
}

// Runs `o` and returns its error ("" when it completed).
std::string run_error(const config::TrainOptions& o) {
  try {
    Trainer(o).run();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A fault that could never fire fails the run before anything is written, naming the option.
TEST_F(Recovery, FaultInjectionThatCannotFireIsRefusedBeforeTheRun) {
  run_ = dir_ + "/run";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"ckpt.fault_phase=write", "ckpt.fault_step=3"}, "no checkpoint is saved at step 3"},
      {{"ckpt.fault_phase=enospc", "ckpt.fault_step=5"}, "no checkpoint is saved at step 5"},
      {{"ckpt.fault_phase=forward", "ckpt.fault_step=7"}, "ckpt.fault_step=7 is past the run's last step"},
      {{"ckpt.fault_phase=backward", "ckpt.fault_step=2", "ckpt.fault_rank=1"}, "ckpt.fault_rank=1 is outside"},
      {{"ckpt.fault_phase=write", "ckpt.fault_step=2", "ckpt.fault_rank=-1"}, "ckpt.fault_rank=-1 (every rank) is for ckpt.fault_phase=enospc only"},
      {{"ckpt.fault_phase=optimizer"}, "needs ckpt.fault_step"},
      {{"ckpt.fault_step=2"}, "needs a ckpt.fault_phase"},
      {{"parallel.sdc_flip_step=2"}, "parallel.sdc_flip_step=2 is not a step with a replica check"},
      {{"parallel.sdc_flip_step=2", "parallel.sdc_every=2"}, "none to compare (dp=1"},
  };
  for (const auto& [extra, needle] : cases) {
    std::vector<std::string> args = {"steps=6", "save_every=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    SCOPED_TRACE(needle);
    EXPECT_NE(run_error(options(args)).find(needle), std::string::npos) << run_error(options(args));
    EXPECT_FALSE(fs::exists(run_)) << "a refused fault plan wrote the run directory";
  }
  // Save phases at a save step (every 2 steps, and the last) are fine: the fault then fires (here,
  // ENOSPC fails the save).
  EXPECT_NE(run_error(options({"steps=5", "save_every=2", "ckpt.fault_phase=enospc", "ckpt.fault_step=5"}))
                .find("No space left on device"),
            std::string::npos);
  fs::remove_all(run_);
  // ENOSPC on every rank (-1): on one rank, that rank's.
  EXPECT_NE(run_error(options({"steps=5", "save_every=2", "ckpt.fault_phase=enospc", "ckpt.fault_step=4",
                               "ckpt.fault_rank=-1"}))
                .find("No space left on device"),
            std::string::npos);
  fs::remove_all(run_);

  // A marker left by an earlier run: another fault's, or this fault's in a new run.
  fs::create_directories(run_);
  write_bytes(run_ + "/fault_armed", "write step 4 rank 0\n");
  EXPECT_NE(run_error(options({"steps=6", "ckpt.fault_phase=forward", "ckpt.fault_step=2"}))
                .find("is left from an earlier run with another fault (write step 4 rank 0)"),
            std::string::npos);
  EXPECT_NE(run_error(options({"steps=6", "save_every=2", "ckpt.fault_phase=write", "ckpt.fault_step=4"}))
                .find("is left from an earlier run: this fault (write step 4 rank 0) would not fire again"),
            std::string::npos);
  fs::remove_all(run_);

  // A step the resumed run has already done.
  Trainer(options({"steps=4", "save_every=2"})).run();
  EXPECT_NE(run_error(options({"steps=6", "resume=auto", "ckpt.fault_phase=forward", "ckpt.fault_step=3"}))
                .find("ckpt.fault_step=3 can never fire: the run resumes after step 4"),
            std::string::npos);
}

// Logs are data: when metrics.jsonl can take no more (here the file size limit, as a full disk), the
// run stops at that step with an error naming the file, and every line left is a whole record.
TEST_F(Recovery, FailedMetricsWriteStopsTheRunAtOnce) {
  run_ = dir_ + "/run";
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 12000;  // a few records; the config and the start record fit
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string what = run_error(options({"steps=200", "save_every=0"}));
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, SIG_DFL);
  EXPECT_NE(what.find("writing " + run_ + "/metrics.jsonl: File too large"), std::string::npos) << what;
  const std::string text = read_bytes(run_ + "/metrics.jsonl");
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "a torn record";
  int records = 0;
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1, records++)
    EXPECT_TRUE(nlohmann::json::accept(text.substr(at, nl - at))) << "line " << records;
  EXPECT_GT(records, 2);
  EXPECT_LT(records, 100) << "the run went on past the failed write";
  EXPECT_FALSE(fs::exists(run_ + "/checkpoints/step_000200")) << "the run went on to the end";
}

// Resuming in another precision says what changed and keeps only what applies: an fp32 run saved
// a loss scale of 1, and fp16 resumed from it starts at loss_scale.init (as a fresh fp16 run), not
// at 1 (every small gradient underflowing); fp16 -> fp16 continues the saved scale; leaving fp16
// drops it.
TEST_F(Recovery, ResumingInAnotherPrecisionResetsWhatNoLongerApplies) {
  run_ = dir_ + "/run";
  Trainer(options({"steps=2", "save_every=2"})).run();
  float saved_scale = 0;
  {
    ::testing::internal::CaptureStderr();
    Trainer t(options({"steps=4", "save_every=2", "resume=auto", "precision=fp16", "loss_scale.init=1024"}));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(t.loss_scaler().scale(), 1024.f) << "fp32 -> fp16 inherited the fp32 run's loss scale";
    EXPECT_NE(err.find("was saved in fp32, resuming in fp16"), std::string::npos) << err;
    EXPECT_NE(err.find("the loss scale starts at loss_scale.init 1024 (not the saved 1)"), std::string::npos) << err;
    t.run();
    saved_scale = t.loss_scaler().scale();
  }
  {
    ::testing::internal::CaptureStderr();
    Trainer t(options({"steps=6", "save_every=2", "resume=auto", "precision=fp16", "loss_scale.init=8"}));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(t.loss_scaler().scale(), saved_scale) << "fp16 -> fp16 did not continue the saved scale";
    EXPECT_EQ(err.find("was saved in"), std::string::npos) << err;
  }
  ::testing::internal::CaptureStderr();
  Trainer t(options({"steps=6", "resume=auto", "precision=bf16"}));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(t.loss_scaler().scale(), 1.f);
  EXPECT_NE(err.find("was saved in fp16, resuming in bf16: fp32 master weights and AdamW moments carry over; "
                     "the saved loss scale (" + strfmt("%g", double(saved_scale)) + ") no longer applies"),
            std::string::npos) << err;
}

// One run per directory: while a run holds out_dir (here: a resume=auto trainer, which locks before
// it scans the checkpoints), a second one fails at once naming the holder's pid and host, whether it
// resumes or starts; once the holder is gone, the next run starts.
TEST_F(Recovery, SecondRunOnAHeldDirectoryFailsNamingTheHolder) {
  run_ = dir_ + "/run";
  Trainer(options({"steps=2", "save_every=2"})).run();
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  const std::string holder = strfmt("(pid %d on host %s)", int(getpid()), host);
  {
    Trainer first(options({"steps=4", "save_every=2", "resume=auto"}));
    for (const char* resume : {"resume=auto", "resume=fresh"}) {
      SCOPED_TRACE(resume);
      const std::string what = run_error(options({"steps=4", "save_every=2", resume}));
      EXPECT_NE(what.find("out_dir '" + run_ + "' is in use by another run " + holder), std::string::npos) << what;
    }
    const std::string what = run_error(options({"steps=4", "out_dir=" + dir_ + "/other", "ckpt.dir=" + run_ + "/checkpoints"}));
    EXPECT_NE(what.find("ckpt.dir '" + run_ + "/checkpoints' is in use by another run " + holder), std::string::npos)
        << what;
    first.run();
  }
  EXPECT_EQ(run_error(options({"steps=6", "save_every=2", "resume=auto"})), "");
}

// The lock is the kernel's (flock): a process killed while holding it leaves the lock file but no
// lock, so a restart takes it; a live holder in another process is named.
TEST_F(Recovery, LockOfAKilledRunNeverBlocksARestart) {
  const std::string dir = dir_ + "/held";
  fs::create_directories(dir);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    DirLock lock(dir, "out_dir");
    (void)!write(ready[1], "x", 1);
    pause();  // killed by the parent while holding the lock
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  try {
    DirLock second(dir, "out_dir");
    ADD_FAILURE() << "two processes held the lock of " << dir;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(strfmt("is in use by another run (pid %d on host", int(child))),
              std::string::npos) << e.what();
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  EXPECT_TRUE(fs::exists(dir + "/" + kDirLockName));
  EXPECT_NO_THROW(DirLock(dir, "out_dir")) << "a killed holder's lock file blocked a restart";
}

}  // namespace
}  // namespace mt::train
