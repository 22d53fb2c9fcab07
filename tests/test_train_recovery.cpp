// Starting a run as a user relies on it: resume=auto refuses checkpoints that exist but do not
// verify (naming each, touching nothing) instead of starting over beside them; resume=fresh starts
// over on request and still never deletes a damaged checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include "checkpoint/catalog.h"
#include "checkpoint/reader.h"
#include "data/shard.h"
#include "runtime/check.h"
#include "train/trainer.h"
#include "tests/test_train_util.h"
#include "tests/test_util.h"

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

  TrainOptions options(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"model=tiny", "model.vocab_size=64", "model.n_layer=1", "model.n_embd=16",
                                     "model.n_head=2", "model.block_size=16", "batch_size=2", "seq_len=16",
                                     "data.path=" + data_, "out_dir=" + run_, "threads=1", "log_every=100"};
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_train_options(args);
  }

  // Every file under the run directory with its bytes.
  std::map<std::string, std::string> snapshot() const {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(run_))
      if (e.is_regular_file()) files[e.path().string()] = read_bytes(e.path().string());
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
std::string run_error(const TrainOptions& o) {
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

}  // namespace
}  // namespace mt::train
