// What the background writer costs and how it shares the machine: the interval during which an async
// save's background part runs (the trainer marks the steps beside it, and scripts/supervise takes
// their slowdown out of the goodput), the writer's CPU time, and its scheduling priority.
//
// Two simulated ranks make the interval deterministic: rank 0's background part cannot commit until
// rank 1 has saved too, so it is in flight for as long as the test holds rank 1 back.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>

#include "checkpoint/checkpointer.h"
#include "checkpoint/writer_thread.h"
#include "parallel/self_comm.h"
#include "tests/test_checkpoint_util.h"
#include "tests/test_util.h"

namespace mt::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::SimulatedJob;
using testing::State;
using Clock = std::chrono::steady_clock;

Options options(const std::string& dir, bool async, WriterPriority p = WriterPriority::idle) {
  Options o;
  o.dir = dir;
  o.async = async;
  o.log = Logger(LogLevel::warn);
  o.writer_priority = p;
  return o;
}

// The threads of this process whose scheduling policy is SCHED_IDLE (field 41 of
// /proc/self/task/<tid>/stat; the fields are counted after the command name's closing parenthesis).
int idle_threads() {
  int n = 0;
  for (const auto& task : fs::directory_iterator("/proc/self/task")) {
    std::ifstream f(task.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));  // field 3 (state) onwards
    std::string v;
    for (int field = 3; field <= 41 && fields >> v; field++)
      if (field == 41 && v == std::to_string(SCHED_IDLE)) n++;
  }
  return n;
}

// Until rank 0's background part has started writing its file (its priority is set before that).
void wait_until_writing(const std::string& dir, int64_t step) {
  const std::string file = dir + "/" + step_dir_name(step) + ".tmp/rank_00000.bin";
  for (int i = 0; i < 3000 && !fs::exists(file); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(file)) << "rank 0's writer never started";
}

TEST(CheckpointWriterCost, OverlapCoversExactlyTheBackgroundWrite) {
  std::mt19937_64 rng(mt::testing::test_seed() + 31);
  const State s = State::random(rng, 4);
  const std::string dir = mt::testing::make_temp_dir("ckpt_overlap");
  SimulatedJob job(2, options(dir, true));
  Checkpointer& r0 = *job.ranks[0];
  const auto before = Clock::now();
  EXPECT_EQ(r0.background_overlap(before - std::chrono::seconds(1), before), 0.0) << "no save yet";

  r0.save(s.request(2, 0, 2));  // in flight until rank 1 saves
  const auto t0 = Clock::now();
  const auto t1 = t0 + std::chrono::milliseconds(250);
  // The whole of a span inside the write, whatever its length, and nothing of a span before it.
  EXPECT_NEAR(r0.background_overlap(t0, t1), 0.25, 1e-9);
  EXPECT_EQ(r0.background_overlap(before - std::chrono::seconds(1), before), 0.0);
  wait_until_writing(dir, 2);
  EXPECT_EQ(idle_threads(), 1) << "the writer runs at idle priority";

  job.ranks[1]->save(s.request(2, 1, 2));
  job.wait();
  const auto after = Clock::now();
  const double whole = r0.background_overlap(before, after);
  EXPECT_GT(whole, 0.0);
  EXPECT_LE(whole, std::chrono::duration<double>(after - before).count());
  EXPECT_EQ(r0.background_overlap(after, after + std::chrono::seconds(1)), 0.0) << "the write is over";
  EXPECT_EQ(idle_threads(), 0) << "the writer's priority stays with the writer";

  const auto st = r0.last_completed();
  ASSERT_TRUE(st.has_value());
  EXPECT_GT(st->writer_cpu_s, 0.0);
  EXPECT_LE(st->writer_cpu_s, st->background_s + 1e-3);  // one thread (the copy helpers did not run: tiny state)
  fs::remove_all(dir);
}

TEST(CheckpointWriterCost, NormalPriorityWriterAndSyncSavesAreNotIdle) {
  std::mt19937_64 rng(mt::testing::test_seed() + 32);
  const State s = State::random(rng, 2);
  const std::string dir = mt::testing::make_temp_dir("ckpt_priority");
  {
    SimulatedJob job(2, options(dir, true, WriterPriority::normal));
    job.ranks[0]->save(s.request(1, 0, 2));
    wait_until_writing(dir, 1);
    EXPECT_EQ(idle_threads(), 0);
    job.ranks[1]->save(s.request(1, 1, 2));
    job.wait();
  }
  parallel::SelfComm self;
  Checkpointer sync(options(dir, false), self);
  const auto t0 = Clock::now();
  sync.save(s.request(2, 0, 1));
  EXPECT_EQ(sync.background_overlap(t0, Clock::now()), 0.0) << "a synchronous save has no background part";
  EXPECT_EQ(idle_threads(), 0) << "a synchronous save runs at the caller's priority";
  fs::remove_all(dir);
}

// Rank 1 lags one save behind rank 0, on its own thread: it saves step k `delay` after rank 0 has
// entered its save of step k + 1 (`entered` counts rank 0's save calls), so that save waits at least
// `delay` for step k's commit, far longer than the CPU time of writing this tiny state, however the
// threads are scheduled. A synchronous save of step k cannot return until rank 1 has saved k too:
// when rank 0 enters no further save within a second, rank 1 goes ahead.
void rank1_lags(SimulatedJob& job, const State& s, int steps, const std::atomic<int>& entered,
                std::chrono::milliseconds delay) {
  for (int step = 1; step <= steps; step++) {
    const auto t0 = Clock::now();
    while (entered < step + 1 && !(entered >= step && Clock::now() - t0 > std::chrono::seconds(1)))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(delay);
    job.ranks[1]->save(s.request(step, 1, 2));
  }
  job.ranks[1]->wait();
}

TEST(CheckpointWriterCost, SavesThatKeepWaitingTurnSynchronous) {
  std::mt19937_64 rng(mt::testing::test_seed() + 33);
  const State s = State::random(rng, 3);
  for (const bool fallback : {true, false}) {
    SCOPED_TRACE(fallback ? "sync_fallback on" : "sync_fallback off");
    const std::string dir = mt::testing::make_temp_dir("ckpt_fallback");
    Options o = options(dir, true);
    o.sync_fallback = fallback;
    SimulatedJob job(2, o);
    Checkpointer& r0 = *job.ranks[0];
    std::atomic<int> entered{0};
    std::thread lagging([&] { rank1_lags(job, s, 4, entered, std::chrono::milliseconds(300)); });
    std::vector<Checkpointer::SaveStats> stats;
    for (int step = 1; step <= 4; step++) {
      entered = step;
      r0.save(s.request(step, 0, 2));
      // A save this rank made synchronous has completed when save() returns.
      if (r0.fell_back()) stats.push_back(*r0.last_completed());
    }
    r0.wait();
    lagging.join();
    EXPECT_EQ(r0.fell_back(), fallback);
    if (fallback) {
      // Saves 2 and 3 waited (kFallbackAfter in a row), so save 3 is the first synchronous one.
      static_assert(Checkpointer::kFallbackAfter == 2);
      ASSERT_EQ(stats.size(), 2u);
      EXPECT_EQ(stats[0].step, 3);
      EXPECT_GT(stats[0].stall_s, 0.1);
      EXPECT_TRUE(stats[0].synchronous && stats[1].synchronous);
    } else {
      EXPECT_TRUE(stats.empty());
    }
    EXPECT_EQ(r0.last_completed()->step, 4);
    EXPECT_EQ(r0.last_completed()->synchronous, fallback);
    fs::remove_all(dir);
  }
}

TEST(CheckpointWriterCost, AsyncSavesThatDoNotWaitStayAsync) {
  std::mt19937_64 rng(mt::testing::test_seed() + 34);
  const State s = State::random(rng, 3);
  const std::string dir = mt::testing::make_temp_dir("ckpt_no_fallback");
  parallel::SelfComm self;
  Checkpointer c(options(dir, true), self);
  for (int step = 1; step <= 4; step++) {
    c.save(s.request(step, 0, 1));
    c.wait();  // the write finishes before the next save: nothing to wait for
  }
  EXPECT_FALSE(c.fell_back());
  EXPECT_FALSE(c.last_completed()->synchronous);
  fs::remove_all(dir);
}

TEST(CheckpointWriterCost, PriorityNamesRoundTripAndBadOnesNameTheFlag) {
  for (WriterPriority p : {WriterPriority::normal, WriterPriority::idle})
    EXPECT_EQ(writer_priority_from_name(writer_priority_name(p), "ckpt.writer_priority"), p);
  try {
    writer_priority_from_name("low", "ckpt.writer_priority");
    FAIL() << "accepted 'low'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt.writer_priority 'low'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::checkpoint
