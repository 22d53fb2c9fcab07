// Saving and reading back: bitwise round trips (sync and async), the async snapshot taken at the
// call, reading under another layout (resharding), the `latest` pointer, retention, statistics.
#include <gtest/gtest.h>

#include <filesystem>
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

Options options(const std::string& dir, bool async, int keep = 3) {
  Options o;
  o.dir = dir;
  o.async = async;
  o.keep = keep;
  o.log = Logger(LogLevel::warn);
  return o;
}

// Every tensor read back whole equals what was saved, bit for bit.
void expect_state(const Reader& r, const State& s) {
  for (size_t i = 0; i < s.tensors.size(); i++) {
    std::vector<float> got(s.values[i].size(), -1.f);
    r.read(s.tensors[i].name, 0, s.tensors[i].numel(), got.data());
    ASSERT_EQ(0, std::memcmp(got.data(), s.values[i].data(), got.size() * 4)) << s.tensors[i].name;
  }
}

TEST(CheckpointRoundTrip, SavedStateReadsBackBitwiseSyncAndAsync) {
  std::mt19937_64 rng(mt::testing::test_seed());
  for (const bool async : {false, true}) {
    const std::string dir = mt::testing::make_temp_dir("ckpt_rt");
    const State s = State::random(rng);
    parallel::SelfComm self;
    {
      Checkpointer ck(options(dir, async), self);
      ck.save(s.request(7, 0, 1));
      ck.wait();
    }
    const Reader r(dir + "/step_000007");
    EXPECT_EQ(r.step(), 7);
    EXPECT_EQ(r.global_meta(), s.request(7, 0, 1).global_meta);
    ASSERT_EQ(r.rank_metas().size(), 1u);
    EXPECT_EQ(r.rank_metas()[0], s.request(7, 0, 1).rank_meta);
    ASSERT_EQ(r.tensors().size(), s.tensors.size());
    for (size_t i = 0; i < s.tensors.size(); i++) EXPECT_EQ(r.tensors()[i].global_shape, s.tensors[i].global_shape);
    expect_state(r, s);
    EXPECT_NO_THROW(verify(r.path()));
    fs::remove_all(dir);
  }
}

// The async save snapshots the state: the caller overwrites every value once save() has returned
// (or, with a deferred snapshot, once snapshot_fence() has), and the files still equal those of a
// synchronous save of the original values. The state is large (36 MB) and overwritten last tensor
// first, so without the snapshot the background writer could not reach the last tensors before
// they change.
void expect_snapshot_at_save(bool deferred) {
  std::mt19937_64 rng(mt::testing::test_seed() + 1);
  State s;
  for (const char* group : {"param/", "adam_m/", "adam_v/"})
    for (int i = 0; i < 3; i++) {
      s.tensors.push_back({std::string(group) + std::to_string(i), {1000, 999 + int64_t(rng() % 3)}, DType::f32});
      s.values.push_back(mt::testing::random_floats(size_t(s.tensors.back().numel()), rng));
    }
  const State original = s;
  const std::string a = mt::testing::make_temp_dir("ckpt_async"), b = mt::testing::make_temp_dir("ckpt_sync");
  parallel::SelfComm self;
  {
    Options o = options(a, true);
    o.deferred_snapshot = deferred;
    Checkpointer ck(o, self);
    ck.save(s.request(3, 0, 1));
    ck.snapshot_fence();
    for (auto v = s.values.rbegin(); v != s.values.rend(); ++v)
      for (float& x : *v) x = -x + 1.f;  // "the next optimizer step", while the save is in flight
    ck.wait();
  }
  {
    Checkpointer ck(options(b, false), self);
    ck.save(original.request(3, 0, 1));
  }
  const std::string fa = testing::file_bytes(a + "/step_000003/rank_00000.bin");
  const std::string fb = testing::file_bytes(b + "/step_000003/rank_00000.bin");
  EXPECT_GT(fa.size(), size_t(original.total()) * 4);
  EXPECT_TRUE(fa == fb) << "async and sync rank files differ";
  nlohmann::json ma = nlohmann::json::parse(testing::file_bytes(a + "/step_000003/manifest.json"));
  nlohmann::json mb = nlohmann::json::parse(testing::file_bytes(b + "/step_000003/manifest.json"));
  for (auto* m : {&ma, &mb}) {
    m->erase("save_id");
    m->erase("created_unix");
    m->erase("manifest_crc32c");  // covers the two above
  }
  EXPECT_EQ(ma, mb);
  expect_state(Reader(a + "/step_000003"), original);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(CheckpointRoundTrip, AsyncSaveIsByteIdenticalToSyncSaveDespiteLaterWrites) { expect_snapshot_at_save(false); }

TEST(CheckpointRoundTrip, DeferredSnapshotIsByteIdenticalToSyncSaveOnceFenced) { expect_snapshot_at_save(true); }

// Written by 4 ranks in ZeRO-like flat shards; read back whole, as 3 ranks would shard it, and at
// random ranges that straddle the writers' piece boundaries.
TEST(CheckpointRoundTrip, ReadsAnyRangeUnderAnotherLayout) {
  std::mt19937_64 rng(mt::testing::test_seed() + 2);
  const State s = State::random(rng, 4, 120);
  const std::string dir = mt::testing::make_temp_dir("ckpt_reshard");
  {
    SimulatedJob job(4, options(dir, true));
    job.save(s, 11);
    job.wait();
  }
  const Reader r(dir + "/step_000011");
  EXPECT_EQ(r.manifest().files.size(), 4u);
  expect_state(r, s);
  for (int rank = 0; rank < 3; rank++)
    for (const Piece& p : s.pieces(rank, 3)) {
      std::vector<float> got(size_t(p.flat_end - p.flat_begin));
      r.read(p.tensor, p.flat_begin, p.flat_end, got.data());
      ASSERT_EQ(0, std::memcmp(got.data(), p.data, got.size() * 4)) << p.tensor << " for reader rank " << rank;
    }
  for (int trial = 0; trial < 100; trial++) {
    const size_t i = rng() % s.tensors.size();
    const int64_t n = s.tensors[i].numel(), b = int64_t(rng() % uint64_t(n)), e = b + int64_t(rng() % uint64_t(n - b + 1));
    std::vector<float> got(size_t(e - b));
    r.read(s.tensors[i].name, b, e, got.data());
    ASSERT_EQ(0, std::memcmp(got.data(), s.values[i].data() + b, got.size() * 4)) << s.tensors[i].name << " [" << b << ", " << e << ")";
  }
  const auto metas = r.rank_metas();
  ASSERT_EQ(metas.size(), 4u);
  for (int rank = 0; rank < 4; rank++) EXPECT_EQ(metas[size_t(rank)]["rank"], rank);
  fs::remove_all(dir);
}

// Reading a range larger than one checksum chunk in the middle of a big piece.
TEST(CheckpointRoundTrip, ReadsRangesSpanningSeveralChecksumChunks) {
  std::mt19937_64 rng(mt::testing::test_seed() + 3);
  State s;
  const int64_t n = int64_t(kChunkBytes / 4) * 2 + 12345;  // two full chunks and a partial one
  s.tensors = {{"param/big", {n}, DType::f32}};
  s.values = {mt::testing::random_floats(size_t(n), rng)};
  const std::string dir = mt::testing::make_temp_dir("ckpt_chunks");
  parallel::SelfComm self;
  {
    Checkpointer ck(options(dir, true), self);
    ck.save(s.request(1, 0, 1));
  }
  const Reader r(dir + "/step_000001");
  EXPECT_EQ(r.manifest().files[0].pieces[0].crc.size(), 3u);
  for (int trial = 0; trial < 10; trial++) {
    const int64_t b = int64_t(rng() % uint64_t(n)), e = b + int64_t(rng() % uint64_t(n - b + 1));
    std::vector<float> got(size_t(e - b));
    r.read("param/big", b, e, got.data());
    ASSERT_EQ(0, std::memcmp(got.data(), s.values[0].data() + b, got.size() * 4)) << "[" << b << ", " << e << ")";
  }
  fs::remove_all(dir);
}

// Replicated state passed by every rank is stored more than once and reads back the same.
TEST(CheckpointRoundTrip, ReplicatedPiecesFromSeveralRanksAreAccepted) {
  std::mt19937_64 rng(mt::testing::test_seed() + 4);
  const State s = State::random(rng, 3);
  const std::string dir = mt::testing::make_temp_dir("ckpt_repl");
  {
    SimulatedJob job(2, options(dir, true));
    for (int r = 0; r < 2; r++) {
      SaveRequest req = s.request(2, r, 2);
      req.pieces = s.pieces(0, 1);  // each rank holds everything
      job.ranks[size_t(r)]->save(req);
    }
    job.wait();
  }
  const Reader r(dir + "/step_000002");
  expect_state(r, s);
  EXPECT_NO_THROW(r.verify_all());
  fs::remove_all(dir);
}

TEST(CheckpointRoundTrip, LatestNamesTheLastCommitAndRetentionKeepsTheNewestK) {
  std::mt19937_64 rng(mt::testing::test_seed() + 5);
  const State s = State::random(rng, 2);
  const std::string dir = mt::testing::make_temp_dir("ckpt_keep");
  {
    SimulatedJob job(2, options(dir, true, /*keep=*/2));
    for (int step : {10, 20, 30, 40}) {
      job.save(s, step);
      job.wait();
      EXPECT_EQ(read_latest(dir), step_dir_name(step));
    }
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_000030", "step_000040"}));
  // What remains holds only the manifest and one file per rank (the rank tables are gone).
  names.clear();
  for (const auto& e : fs::directory_iterator(dir + "/step_000040")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"manifest.json", "rank_00000.bin", "rank_00001.bin"}));
  fs::remove_all(dir);
}

// After resuming from an older checkpoint, the new run's commits are the newest even though an
// abandoned higher step exists; a re-save of an existing step replaces it.
TEST(CheckpointRoundTrip, NewestMeansLastCommittedAndResavingAStepReplacesIt) {
  std::mt19937_64 rng(mt::testing::test_seed() + 6);
  const State a = State::random(rng, 2), b = State::random(rng, 2);
  const std::string dir = mt::testing::make_temp_dir("ckpt_order");
  parallel::SelfComm self;
  {
    Checkpointer ck(options(dir, true, 0), self);
    ck.save(a.request(10, 0, 1));
    ck.save(a.request(20, 0, 1));
  }
  {
    Checkpointer ck(options(dir, true, 0), self);  // "resumed from step 10"
    ck.save(b.request(15, 0, 1));
    ck.save(b.request(10, 0, 1));                  // a re-save of step 10 with other values
  }
  const Logger quiet(LogLevel::error);
  const auto found = find_latest_valid(dir, self, quiet);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 10);
  expect_state(Reader(found->path), b);
  EXPECT_EQ(read_latest(dir), "step_000010");
  fs::remove_all(dir);
}

// Retention keeps the newest commits, not the highest steps: after resuming from step 10 beside an
// abandoned run's steps 20 and 30, the resumed run's saves (15, then 20 again) are the ones kept.
// Ordered by step, keep = 1 or 2 would delete the checkpoint just committed.
TEST(CheckpointRoundTrip, RetentionAfterResumingFromAnOlderCheckpointKeepsTheNewCommits) {
  std::mt19937_64 rng(mt::testing::test_seed() + 9);
  const State a = State::random(rng, 2), b = State::random(rng, 2);
  for (const int keep : {1, 2}) {
    SCOPED_TRACE("keep=" + std::to_string(keep));
    const std::string dir = mt::testing::make_temp_dir("ckpt_keep_resumed");
    parallel::SelfComm self;
    {
      Checkpointer ck(options(dir, false, 0), self);  // the abandoned run
      for (int64_t step : {10, 20, 30}) ck.save(a.request(step, 0, 1));
    }
    Checkpointer ck(options(dir, false, keep), self);  // resumed from step 10
    ck.save(b.request(15, 0, 1));
    EXPECT_TRUE(fs::exists(dir + "/step_000015")) << "retention deleted the checkpoint it had just committed";
    ck.save(b.request(20, 0, 1));
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    const std::vector<std::string> want = keep == 1 ? std::vector<std::string>{"latest", "step_000020"}
                                                    : std::vector<std::string>{"latest", "step_000015", "step_000020"};
    EXPECT_EQ(names, want);
    EXPECT_EQ(read_latest(dir), "step_000020");
    expect_state(Reader(dir + "/step_000020"), b);
    fs::remove_all(dir);
  }
}

TEST(CheckpointRoundTrip, StatsReportEachCompletedSave) {
  std::mt19937_64 rng(mt::testing::test_seed() + 7);
  const State s = State::random(rng, 3);
  const std::string dir = mt::testing::make_temp_dir("ckpt_stats");
  parallel::SelfComm self;
  for (const bool async : {false, true}) {
    Checkpointer ck(options(dir, async), self);
    EXPECT_FALSE(ck.last_completed().has_value());
    ck.save(s.request(async ? 2 : 1, 0, 1));
    ck.wait();
    const auto st = ck.last_completed();
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->step, async ? 2 : 1);
    EXPECT_EQ(st->bytes, fs::file_size(dir + "/" + step_dir_name(st->step) + "/rank_00000.bin"));
    EXPECT_GT(st->background_s, 0.0);
    EXPECT_GE(st->blocking_s, st->stall_s);
    if (!async) {
      EXPECT_GE(st->blocking_s, st->background_s);  // a synchronous save blocks for all of it
    }
  }
  fs::remove_all(dir);
}

TEST(CheckpointRoundTrip, BadRequestsAreRejectedNamingTheProblem) {
  std::mt19937_64 rng(mt::testing::test_seed() + 8);
  const State s = State::random(rng, 2);
  const std::string dir = mt::testing::make_temp_dir("ckpt_bad");
  parallel::SelfComm self;
  Checkpointer ck(options(dir, true), self);
  auto expect_error = [&](SaveRequest req, const std::string& needle) {
    try {
      ck.save(req);
      FAIL() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  SaveRequest r = s.request(1, 0, 1);
  r.pieces[0].tensor = "param/nope";
  expect_error(r, "param/nope");
  r = s.request(1, 0, 1);
  r.pieces[0].flat_end = s.tensors[0].numel() + 1;
  expect_error(r, "not inside the tensor");
  r = s.request(1, 0, 1);
  r.tensors.push_back(r.tensors[0]);
  expect_error(r, "listed twice");
  r = s.request(1, 0, 1);
  r.pieces.pop_back();  // a tensor left partly uncovered: caught at commit, reported by wait()
  ck.save(r);
  try {
    ck.wait();
    FAIL() << "an incomplete checkpoint was committed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("held by no file"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir + "/step_000001"));
  EXPECT_FALSE(fs::exists(dir + "/step_000001.tmp"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mt::checkpoint
