// Failures during a save: a process killed at each phase (in a forked child), a full disk on this
// rank or another, a rank that never writes, leftovers of unfinished saves, unusable directories.
// The promise in every case: the previous checkpoint stays loadable and in force, and the failure
// is reported with the path and the cause.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <random>

#include "checkpoint/catalog.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/reader.h"
#include "parallel/self_comm.h"
#include "tests/test_checkpoint_util.h"
#include "tests/test_util.h"

namespace mt::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::SimulatedJob;
using testing::State;

Options options(const std::string& dir, bool async) {
  Options o;
  o.dir = dir;
  o.async = async;
  o.log = Logger(LogLevel::error);
  return o;
}

// Runs fn in a forked child and returns its wait status. The child exits 0 when fn returns and 1
// when it throws; only this thread exists in the child, and no Checkpointer is alive when forking.
int run_in_child(const std::function<void()>& fn) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    try {
      fn();
    } catch (...) {
      code = 1;
    }
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

bool killed(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }

void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
  }
}

// The checkpoint that must survive: step 1, committed, with its latest pointer.
std::string committed_step_1(const State& s) {
  const std::string dir = mt::testing::make_temp_dir("ckpt_fault");
  parallel::SelfComm self;
  Checkpointer ck(options(dir, true), self);
  ck.save(s.request(1, 0, 1));
  ck.wait();
  return dir;
}

std::optional<Found> latest_valid(const std::string& dir) {
  parallel::SelfComm self;
  return find_latest_valid(dir, self, Logger(LogLevel::error));
}

TEST(CheckpointFaults, FaultPointKillsOnlyAtTheNamedRankStepAndPhase) {
  Options o;
  o.fault_phase = "backward";
  o.fault_step = 7;
  o.fault_rank = 1;
  fault_point(o, 0, 7, "backward");  // other rank
  fault_point(o, 1, 6, "backward");  // other step
  fault_point(o, 1, 7, "forward");   // other phase
  EXPECT_TRUE(killed(run_in_child([&] { fault_point(o, 1, 7, "backward"); })));
  o.fault_phase = "enospc";  // not a kill phase
  EXPECT_EQ(run_in_child([&] { fault_point(o, 1, 7, "enospc"); }), 0);
  EXPECT_TRUE(is_fault_phase("before_commit"));
  EXPECT_FALSE(is_fault_phase("lunch"));
  o.dir = "unused";
  parallel::SelfComm self;
  o.fault_phase = "lunch";
  expect_error([&] { Checkpointer ck(o, self); }, {"unknown fault phase 'lunch'"});
}

// Killed before the commit (at before_commit, with the manifest already in step_000002.tmp/): the
// unfinished step_000002.tmp/ is never loaded, step 1 stays in force with `latest` naming it, and
// the next run deletes the leftovers and saves step 2 normally.
TEST(CheckpointFaults, SaveKilledBeforeCommitLeavesThePreviousCheckpointInForce) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const State s = State::random(rng, 4, 200);
  for (const bool async : {true, false})
    for (const char* phase : {"staging", "write", "before_commit"}) {
      SCOPED_TRACE(std::string(phase) + (async ? " async" : " sync"));
      const std::string dir = committed_step_1(s);
      Options o = options(dir, async);
      o.fault_phase = phase;
      o.fault_step = 2;
      const int status = run_in_child([&] {
        parallel::SelfComm self;
        Checkpointer ck(o, self);
        ck.save(s.request(2, 0, 1));
        ck.wait();
      });
      EXPECT_TRUE(killed(status)) << "status " << status;
      EXPECT_TRUE(fs::exists(dir + "/step_000002.tmp"));  // the kill did happen mid-save
      // before_commit is the last moment before the commit (the manifest is written), so whatever
      // the commit publishes, `latest` included, must come after it.
      EXPECT_EQ(fs::exists(dir + "/step_000002.tmp/manifest.json"), std::string(phase) == "before_commit");
      EXPECT_FALSE(fs::exists(dir + "/step_000002"));
      EXPECT_EQ(read_latest(dir), "step_000001");
      const auto found = latest_valid(dir);
      ASSERT_TRUE(found.has_value());
      EXPECT_EQ(found->step, 1);
      EXPECT_NO_THROW(verify(found->path));
      if (std::string(phase) == "write") {  // half the rank file was on disk
        const auto size = fs::file_size(dir + "/step_000002.tmp/rank_00000.bin");
        EXPECT_GT(size, 0u);
        EXPECT_LT(size, fs::file_size(dir + "/step_000001/rank_00000.bin"));
      }
      {
        parallel::SelfComm self;
        Checkpointer ck(options(dir, async), self);  // the restarted run
        EXPECT_FALSE(fs::exists(dir + "/step_000002.tmp"));
        ck.save(s.request(2, 0, 1));
      }
      EXPECT_EQ(latest_valid(dir)->step, 2);
      fs::remove_all(dir);
    }
}

TEST(CheckpointFaults, SaveKilledAfterCommitLeavesTheNewCheckpointInForce) {
  std::mt19937_64 rng(mt::testing::test_seed() + 1);
  const State s = State::random(rng, 3);
  const std::string dir = committed_step_1(s);
  Options o = options(dir, true);
  o.fault_phase = "after_commit";
  o.fault_step = 2;
  EXPECT_TRUE(killed(run_in_child([&] {
    parallel::SelfComm self;
    Checkpointer ck(o, self);
    ck.save(s.request(2, 0, 1));
    ck.wait();
  })));
  EXPECT_EQ(read_latest(dir), "step_000002");
  EXPECT_EQ(latest_valid(dir)->step, 2);
  fs::remove_all(dir);
}

// Two simulated ranks in one child process, rank 1 killed (which kills both): before rank 1 has
// announced its file, no commit can happen; once it has seen the commit, the new checkpoint is in
// force even if `latest` was not yet updated.
TEST(CheckpointFaults, KillOnAnotherRankCommitsOnlyAfterItsFileWasAnnounced) {
  std::mt19937_64 rng(mt::testing::test_seed() + 8);
  const State s = State::random(rng, 3);
  for (const char* phase : {"staging", "write", "before_commit", "after_commit"}) {
    SCOPED_TRACE(phase);
    const std::string dir = mt::testing::make_temp_dir("ckpt_fault2");
    Options o = options(dir, true);
    {
      SimulatedJob job(2, o);
      job.save(s, 1);
      job.wait();
    }
    o.fault_phase = phase;
    o.fault_step = 2;
    o.fault_rank = 1;
    EXPECT_TRUE(killed(run_in_child([&] {
      SimulatedJob job(2, o);
      job.save(s, 2);
      job.wait();
    })));
    const bool committed = std::string(phase) == "after_commit";
    EXPECT_EQ(fs::exists(dir + "/step_000002"), committed);
    EXPECT_EQ(latest_valid(dir)->step, committed ? 2 : 1);
    fs::remove_all(dir);
  }
}

TEST(CheckpointFaults, FullDiskFailsTheSaveClearlyAndKeepsThePreviousCheckpoint) {
  std::mt19937_64 rng(mt::testing::test_seed() + 2);
  const State s = State::random(rng, 3);
  for (const bool async : {true, false}) {
    SCOPED_TRACE(async ? "async" : "sync");
    const std::string dir = committed_step_1(s);
    Options o = options(dir, async);
    o.fault_phase = "enospc";
    o.fault_step = 2;
    parallel::SelfComm self;
    Checkpointer ck(o, self);
    const std::vector<std::string> needles = {"step 2", "step_000002.tmp/rank_00000.bin", "No space left on device",
                                              "errno 28", "earlier checkpoints are untouched"};
    if (async) {
      ck.save(s.request(2, 0, 1));  // the failure happens in the background...
      expect_error([&] { ck.wait(); }, needles);  // ...and is reported by the next wait() or save()
    } else {
      expect_error([&] { ck.save(s.request(2, 0, 1)); }, needles);
    }
    EXPECT_FALSE(fs::exists(dir + "/step_000002.tmp"));
    EXPECT_FALSE(fs::exists(dir + "/step_000002"));
    EXPECT_EQ(read_latest(dir), "step_000001");
    EXPECT_NO_THROW(verify(dir + "/step_000001"));
    ck.save(s.request(3, 0, 1));  // the error was reported once; the checkpointer carries on
    ck.wait();
    EXPECT_EQ(latest_valid(dir)->step, 3);
    fs::remove_all(dir);
  }
}

TEST(CheckpointFaults, FullDiskOnAnotherRankFailsTheSaveOnEveryRank) {
  std::mt19937_64 rng(mt::testing::test_seed() + 3);
  const State s = State::random(rng, 3);
  const std::string dir = mt::testing::make_temp_dir("ckpt_enospc2");
  Options o = options(dir, true);
  {
    SimulatedJob job(2, o);
    job.save(s, 1);
    job.wait();
  }
  o.fault_phase = "enospc";
  o.fault_step = 2;
  o.fault_rank = 1;
  SimulatedJob job(2, o);
  job.save(s, 2);
  expect_error([&] { job.ranks[0]->wait(); }, {"rank 1 failed", "rank_00001.bin", "No space left on device"});
  expect_error([&] { job.ranks[1]->wait(); }, {"No space left on device"});
  EXPECT_FALSE(fs::exists(dir + "/step_000002.tmp"));
  EXPECT_EQ(read_latest(dir), "step_000001");
  EXPECT_EQ(latest_valid(dir)->step, 1);
  fs::remove_all(dir);
}

TEST(CheckpointFaults, RankThatNeverWritesTimesOutTheCommit) {
  std::mt19937_64 rng(mt::testing::test_seed() + 4);
  const State s = State::random(rng, 2);
  const std::string dir = mt::testing::make_temp_dir("ckpt_timeout");
  Options o = options(dir, true), patient = o;
  o.commit_timeout_s = 0.3;  // rank 0 gives up first; the others see it abandon the save
  SimulatedJob job(3, o, {o, patient, patient});
  job.ranks[0]->save(s.request(1, 0, 3));
  job.ranks[2]->save(s.request(1, 2, 3));  // rank 1 never saves (a hung or dead process)
  try {
    job.ranks[0]->wait();
    ADD_FAILURE() << "rank 0's commit waited past its timeout without failing";
  } catch (const parallel::AgreedError& e) {  // a wait on peers like a collective: exit status 4
    EXPECT_EQ(e.exit_status(), kExitHung);
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank(s) 1 "), std::string::npos) << e.what();
  }
  expect_error([&] { job.ranks[2]->wait(); }, {"abandoned"});
  EXPECT_FALSE(fs::exists(dir + "/step_000001.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/step_000001"));
  fs::remove_all(dir);
}

// A Checkpointer destroyed while an exception unwinds (the training failed) does not sit out the
// commit timeout waiting for ranks that may be gone.
TEST(CheckpointFaults, UnwindingStopsWaitingForOtherRanks) {
  std::mt19937_64 rng(mt::testing::test_seed() + 7);
  const State s = State::random(rng, 2);
  const std::string dir = mt::testing::make_temp_dir("ckpt_unwind");
  Options o = options(dir, true);
  o.commit_timeout_s = 60;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    SimulatedJob job(2, o);
    job.ranks[0]->save(s.request(1, 0, 2));  // rank 1 never saves
    throw std::runtime_error("the training step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_FALSE(fs::exists(dir + "/step_000001"));
  fs::remove_all(dir);
}

// One failure, one line: a save that a failing process leaves unfinished (it was waiting for a rank
// that never wrote) is not reported as a failure of its own; the process reports the error that
// ended it. The unfinished save leaves no checkpoint and no step_N.tmp.
TEST(CheckpointFaults, UnwindingLeavesTheUnfinishedSaveUnreported) {
  std::mt19937_64 rng(mt::testing::test_seed() + 9);
  const State s = State::random(rng, 2);
  const std::string dir = mt::testing::make_temp_dir("ckpt_unwind_quiet");
  testing::CapturedLog log;
  Options o = options(dir, true);
  o.log = log.logger;
  o.commit_timeout_s = 60;
  try {
    SimulatedJob job(2, o);
    job.ranks[0]->save(s.request(1, 0, 2));  // rank 1 never saves
    throw std::runtime_error("the training step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(log.text(), "");
  EXPECT_FALSE(fs::exists(dir + "/step_000001"));
  EXPECT_FALSE(fs::exists(dir + "/step_000001.tmp"));
  fs::remove_all(dir);
}

// A directory without a manifest is never loaded, whatever else it holds; *.tmp leftovers are
// deleted when a Checkpointer starts, other directories are left alone.
TEST(CheckpointFaults, UnfinishedSavesAreNeverLoadedAndTmpLeftoversAreCleanedAtStart) {
  std::mt19937_64 rng(mt::testing::test_seed() + 5);
  const State s = State::random(rng, 3);
  const std::string dir = committed_step_1(s);
  fs::copy(dir + "/step_000001", dir + "/step_000005.tmp");  // complete, but never renamed
  fs::copy(dir + "/step_000001", dir + "/step_000006");
  fs::remove(dir + "/step_000006/manifest.json");  // renamed by hand, without its manifest
  testing::CapturedLog log;
  parallel::SelfComm self;
  const auto found = find_latest_valid(dir, self, log.logger);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 1);
  EXPECT_NE(log.text().find("skipping " + dir + "/step_000006"), std::string::npos) << log.text();
  {
    Checkpointer ck(options(dir, true), self);
  }
  EXPECT_FALSE(fs::exists(dir + "/step_000005.tmp"));
  EXPECT_TRUE(fs::exists(dir + "/step_000006"));
  fs::remove_all(dir);
}

TEST(CheckpointFaults, UncreatableDirectoryIsAClearError) {
  const std::string base = mt::testing::make_temp_dir("ckpt_nodir");
  testing::write_bytes(base + "/file", "not a directory");
  parallel::SelfComm self;
  expect_error([&] { Checkpointer ck(options(base + "/file/ckpt", true), self); }, {base + "/file/ckpt", "Not a directory"});
  fs::remove_all(base);
}

TEST(CheckpointFaults, ReadOnlyDirectoryIsAClearErrorAndTouchesNothing) {
  std::mt19937_64 rng(mt::testing::test_seed() + 6);
  const State s = State::random(rng, 2);
  const std::string dir = committed_step_1(s);
  chmod(dir.c_str(), 0555);
  const bool writable = access(dir.c_str(), W_OK) == 0;  // root ignores permission bits
  if (!writable) {
    parallel::SelfComm self;
    expect_error([&] { Checkpointer ck(options(dir, true), self); }, {dir, "not writable", "Permission denied"});
  }
  chmod(dir.c_str(), 0755);
  EXPECT_NO_THROW(verify(dir + "/step_000001"));
  EXPECT_EQ(read_latest(dir), "step_000001");
  fs::remove_all(dir);
  if (writable) GTEST_SKIP() << "running as root: permission bits do not make a directory read-only";
}

}  // namespace
}  // namespace mt::checkpoint
