// Damaged and foreign checkpoints: a flipped byte, a truncated or deleted rank file, a deleted
// manifest are each detected (by verify(), by Reader, and by find_latest_valid, which then takes
// the next older checkpoint and says why); an intact checkpoint loads (the positive control); an
// unknown format version, a path that is not a checkpoint and another model's shape are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>

#include "checkpoint/checkpointer.h"
#include "checkpoint/cli.h"
#include "checkpoint/reader.h"
#include "parallel/self_comm.h"
#include "tests/test_checkpoint_util.h"
#include "tests/test_util.h"

namespace mt::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::SimulatedJob;
using testing::State;

// Two checkpoints (steps 10 and 20) written by two simulated ranks.
// `newest` fails verification with a message containing `needle`, and find_latest_valid falls back to
// step 10 of `dir`; returns what it logged.
std::string expect_refused_and_older_chosen(const std::string& dir, const std::string& newest,
                                            const std::string& needle) {
  try {
    verify(newest);
    ADD_FAILURE() << "verify() accepted a damaged checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  testing::CapturedLog log;
  parallel::SelfComm self;
  const auto found = find_latest_valid(dir, self, log.logger);
  EXPECT_TRUE(found.has_value() && found->step == 10) << log.text();
  return log.text();
}

struct TwoCheckpoints {
  std::mt19937_64 rng{mt::testing::test_seed()};
  State s = State::random(rng, 4, 150);
  std::string dir = mt::testing::make_temp_dir("ckpt_corrupt");
  std::string newest = dir + "/step_000020";

  // `change_newest` alters the state saved at step 20 (e.g. puts a NaN in it).
  explicit TwoCheckpoints(const std::function<void(State&)>& change_newest = {}) {
    Options o;
    o.dir = dir;
    o.log = Logger(LogLevel::error);
    SimulatedJob job(2, o);
    job.save(s, 10);
    job.wait();
    State newest_state = s;
    if (change_newest) change_newest(newest_state);
    job.save(newest_state, 20);
    job.wait();
  }
  ~TwoCheckpoints() { fs::remove_all(dir); }

  // The newest checkpoint fails verification with a message containing `needle`, and
  // find_latest_valid falls back to step 10, logging why it skipped step 20.
  void expect_detected_and_skipped(const std::string& needle) {
    const std::string text = expect_refused_and_older_chosen(dir, newest, needle);
    EXPECT_NE(text.find("skipping " + newest), std::string::npos) << text;
    EXPECT_NE(text.find("step_000010"), std::string::npos) << text;
    char verify_cmd[] = "verify";
    std::string path = newest;
    char* argv[] = {verify_cmd, path.data()};
    EXPECT_EQ(ckpt_cli(2, argv), 1);
    std::string latest = dir + "/latest";  // names the damaged newest
    char* latest_argv[] = {verify_cmd, latest.data()};
    EXPECT_EQ(ckpt_cli(2, latest_argv), 1);
  }
};

TEST(CheckpointCorruption, IntactCheckpointsVerifyAndTheNewestIsChosen) {
  TwoCheckpoints c;
  EXPECT_NO_THROW(verify(c.newest));
  EXPECT_NO_THROW(verify(c.dir + "/step_000010"));
  parallel::SelfComm self;
  const auto found = find_latest_valid(c.dir, self, Logger(LogLevel::error));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 20);
  EXPECT_EQ(found->path, c.newest);
  char ls[] = "ls", verify_cmd[] = "verify";
  char* ls_argv[] = {ls, c.dir.data()};
  EXPECT_EQ(ckpt_cli(2, ls_argv), 0);
  char* verify_argv[] = {verify_cmd, c.dir.data()};  // a root: every checkpoint under it
  EXPECT_EQ(ckpt_cli(2, verify_argv), 0);
  std::string latest = c.dir + "/latest", missing = c.dir + "/nothing/latest";
  char* latest_argv[] = {verify_cmd, latest.data()};  // the checkpoint the root's latest file names
  EXPECT_EQ(ckpt_cli(2, latest_argv), 0);
  char* missing_argv[] = {verify_cmd, missing.data()};
  EXPECT_EQ(ckpt_cli(2, missing_argv), 1);
  char* usage_argv[] = {verify_cmd};
  EXPECT_EQ(ckpt_cli(1, usage_argv), 2);
}

// Any single byte of a rank file is covered by a checksum: one random byte flipped in the header,
// in the tensor data, or in the rank metadata.
TEST(CheckpointCorruption, FlippedByteAnywhereInARankFileIsDetected) {
  for (const char* region : {"header", "data", "metadata"}) {
    TwoCheckpoints c;
    const int rank = int(c.rng() % 2);
    const std::string file = c.newest + "/rank_0000" + std::to_string(rank) + ".bin";
    const FileRecord rec = Reader(c.newest).manifest().files[size_t(rank)];
    std::string bytes = testing::file_bytes(file);
    const uint64_t lo = region[0] == 'h' ? 0 : region[0] == 'd' ? kHeaderBytes : rec.meta.offset;
    const uint64_t hi = region[0] == 'h' ? kHeaderBytes : region[0] == 'd' ? rec.meta.offset : bytes.size();
    const size_t at = size_t(lo + c.rng() % (hi - lo));
    bytes[at] = char(bytes[at] ^ (1 << (c.rng() % 8)));
    testing::write_bytes(file, bytes);
    SCOPED_TRACE(std::string(region) + ": flipped byte " + std::to_string(at) + " of " + file);
    c.expect_detected_and_skipped(file);
  }
}

// The header's reserved bytes (20..23 and 32..63, zero) are read by no field check: only the
// header checksum can see a flip there. The random flip above lands in them about half the time.
TEST(CheckpointCorruption, FlippedReservedHeaderByteIsCaughtByTheHeaderChecksum) {
  for (const size_t at : {size_t(21), size_t(32), size_t(kHeaderBytes - 1)}) {
    TwoCheckpoints c;
    const std::string file = c.newest + "/rank_00001.bin";
    std::string bytes = testing::file_bytes(file);
    ASSERT_EQ(bytes[at], 0) << "byte " << at << " is not a reserved one";
    bytes[at] = char(0x40);
    testing::write_bytes(file, bytes);
    SCOPED_TRACE("flipped header byte " + std::to_string(at));
    c.expect_detected_and_skipped(file + ": header checksum mismatch");
  }
}

// A manifest (not necessarily written by this build) whose pieces leave a hole in the middle of a
// tensor, every other check intact: one tensor of 30 elements in three pieces, the middle piece's
// range rewritten to repeat the last one, so elements [10, 20) are in no file.
TEST(CheckpointCorruption, ManifestWithAHoleInsideATensorIsRefused) {
  std::mt19937_64 rng{mt::testing::test_seed()};
  const std::vector<float> v = mt::testing::random_floats(30, rng);
  const std::string dir = mt::testing::make_temp_dir("ckpt_hole");
  {
    parallel::SelfComm self;
    Options o;
    o.dir = dir;
    o.log = Logger(LogLevel::error);
    Checkpointer ck(o, self);
    for (int64_t step : {10, 20}) {
      SaveRequest req;
      req.step = step;
      req.tensors = {{"param/w", {30}, DType::f32}};
      for (int64_t b : {0, 10, 20}) req.pieces.push_back({"param/w", b, b + 10, v.data() + b});
      ck.save(req);
      ck.wait();
    }
  }
  const std::string newest = dir + "/step_000020", path = newest + "/manifest.json";
  nlohmann::json m = nlohmann::json::parse(testing::file_bytes(path));
  nlohmann::json& pieces = m["files"][0]["pieces"];
  ASSERT_EQ(pieces.size(), 3u);
  ASSERT_EQ(pieces[1]["flat"], nlohmann::json({10, 20}));
  pieces[1]["flat"] = {20, 30};  // same length, same bytes and checksums: only the coverage is wrong
  // Sealed again, as a writer with this bug would have sealed it: only the coverage check can object.
  m["manifest_crc32c"] = manifest_crc(m);
  testing::write_bytes(path, m.dump());
  const std::string needle = "tensor 'param/w': elements [10, 20) are held by no file";
  const std::string text = expect_refused_and_older_chosen(dir, newest, needle);
  EXPECT_NE(text.find(needle), std::string::npos) << text;
  fs::remove_all(dir);
}

// A read that starts inside a checksum chunk of a flat piece (as resuming under another layout
// reads each parameter's new shard) checks that chunk too: the element holding a flipped byte, read
// alone, fails.
TEST(CheckpointCorruption, ReadStartingMidChunkOfAFlatPieceFailsOnAFlippedByte) {
  TwoCheckpoints c;
  const Reader good(c.newest);
  const PieceRecord& p = good.manifest().files[0].pieces[0];
  ASSERT_FALSE(p.is_box());
  ASSERT_GE(p.numel(), 3) << "the piece needs an element strictly inside its chunk";
  const int64_t k = 1 + int64_t(c.rng() % uint64_t(p.numel() - 2));  // neither the first nor the last
  const std::string file = c.newest + "/rank_00000.bin";
  std::string bytes = testing::file_bytes(file);
  const size_t at = size_t(p.offset + uint64_t(k) * 4 + c.rng() % 4);
  bytes[at] = char(bytes[at] ^ (1 << (c.rng() % 8)));
  testing::write_bytes(file, bytes);
  const Reader r(c.newest);
  float x = 0;
  try {
    r.read(p.tensor, p.flat_begin + k, p.flat_begin + k + 1, &x);
    ADD_FAILURE() << "element " << k << " of a piece with a flipped byte read without error: " << x;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch in tensor '" + p.tensor + "'"), std::string::npos) << e.what();
  }
}

// A flip inside tensor data is also caught by a plain read, not only by verify().
TEST(CheckpointCorruption, ReadingAFlippedTensorChunkFails) {
  TwoCheckpoints c;
  const Reader good(c.newest);
  const PieceRecord& p = good.manifest().files[0].pieces[0];
  const std::string file = c.newest + "/rank_00000.bin";
  std::string bytes = testing::file_bytes(file);
  bytes[p.offset + p.length / 2] ^= 0x10;
  testing::write_bytes(file, bytes);
  const Reader r(c.newest);  // the manifest and header are fine
  std::vector<float> out(size_t(p.flat_end - p.flat_begin));
  try {
    r.read(p.tensor, p.flat_begin, p.flat_end, out.data());
    ADD_FAILURE() << "read a corrupt chunk without error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch in tensor '" + p.tensor + "'"), std::string::npos) << e.what();
  }
}

// A checkpoint holding a NaN or an infinity (a diverged run's) is refused like a damaged one, by
// verify(), by a plain read and by find_latest_valid, which takes the finite one before it.
TEST(CheckpointCorruption, NonFiniteValuesAreRefusedLikeDamage) {
  for (float bad : {NAN, INFINITY}) {
    TwoCheckpoints c([&](State& st) { st.values[4][st.values[4].size() / 2] = bad; });
    const std::string needle = std::string("non-finite value (") + (std::isnan(bad) ? "NaN" : "inf") + ")";
    c.expect_detected_and_skipped(needle);
    const Reader r(c.newest);
    std::vector<float> out(size_t(c.s.tensors[4].numel()));
    EXPECT_THROW(r.read(c.s.tensors[4].name, 0, c.s.tensors[4].numel(), out.data()), Error);
  }
}

// Flips one byte in the tensor data of rank 0's file of `ckpt`.
void damage(const std::string& ckpt) {
  const std::string file = ckpt + "/rank_00000.bin";
  std::string bytes = testing::file_bytes(file);
  bytes[kHeaderBytes + 5] ^= 0x04;
  testing::write_bytes(file, bytes);
  EXPECT_THROW(verify(ckpt), Error);
}

// Retention deletes old checkpoints that verify; a damaged one (whose weights may well be intact) is
// left for a person to look at, and a re-save of its step moves it aside instead of deleting it.
TEST(CheckpointCorruption, DamagedCheckpointsAreNeverDeleted) {
  std::mt19937_64 rng{mt::testing::test_seed()};
  const State s = State::random(rng, 4, 150);
  const std::string dir = mt::testing::make_temp_dir("ckpt_keep");
  testing::CapturedLog log;
  Options o;
  o.dir = dir;
  o.keep = 1;
  o.log = log.logger;
  SimulatedJob job(2, o);
  auto save = [&](int64_t step) {
    job.save(s, step);
    job.wait();
  };
  save(10);
  damage(dir + "/step_000010");
  save(20);
  save(30);
  EXPECT_TRUE(fs::exists(dir + "/step_000010")) << "retention deleted a damaged checkpoint";
  EXPECT_FALSE(fs::exists(dir + "/step_000020")) << "retention kept an intact checkpoint beyond keep=1";
  EXPECT_NE(log.text().find("keeping " + dir + "/step_000010, which does not verify"), std::string::npos) << log.text();
  damage(dir + "/step_000030");
  save(30);  // as a run resumed from an older checkpoint saves the same step again
  EXPECT_NO_THROW(verify(dir + "/step_000030"));
  int aside = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("step_000030.damaged-", 0) == 0) aside++;
  EXPECT_EQ(aside, 1) << "the damaged step_000030 was deleted by the re-save";
  fs::remove_all(dir);
}

TEST(CheckpointCorruption, TruncatedRankFileIsDetected) {
  TwoCheckpoints c;
  const std::string file = c.newest + "/rank_00001.bin";
  fs::resize_file(file, fs::file_size(file) - 1 - c.rng() % 100);
  c.expect_detected_and_skipped("truncated");
}

TEST(CheckpointCorruption, DeletedRankFileIsDetected) {
  TwoCheckpoints c;
  fs::remove(c.newest + "/rank_00000.bin");
  c.expect_detected_and_skipped("rank_00000.bin: No such file or directory");
}

TEST(CheckpointCorruption, DeletedManifestIsDetected) {
  TwoCheckpoints c;
  fs::remove(c.newest + "/manifest.json");
  c.expect_detected_and_skipped("no manifest.json");
}

TEST(CheckpointCorruption, DamagedManifestIsDetected) {
  TwoCheckpoints c;
  const std::string path = c.newest + "/manifest.json";
  std::string text = testing::file_bytes(path);
  text.resize(text.size() / 2);  // cut mid-way
  testing::write_bytes(path, text);
  c.expect_detected_and_skipped("malformed JSON");
}

// An older checkpoint whose manifest cannot be read is named, but not as if the newest had been given
// up for it: its age is unknown, and the newest checkpoint, intact, is the one resumed.
TEST(CheckpointCorruption, DamagedOlderManifestIsNamedWithoutClaimingToFallBack) {
  TwoCheckpoints c;
  const std::string older = c.dir + "/step_000010";
  std::string text = testing::file_bytes(older + "/manifest.json");
  text.resize(text.size() / 2);
  testing::write_bytes(older + "/manifest.json", text);
  testing::CapturedLog log;
  parallel::SelfComm self;
  const auto found = find_latest_valid(c.dir, self, log.logger);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->step, 20);
  EXPECT_NE(log.text().find("skipping " + older + ": "), std::string::npos) << log.text();
  EXPECT_EQ(log.text().find("trying the next older one"), std::string::npos) << log.text();
}

// Every byte a resume reads is checked, the manifest's own values too: the trainer's state in "meta"
// (step, update count, loader position), the commit time that orders checkpoints, the file table.
// Reformatting the file (whitespace, key order) changes no value and still verifies.
TEST(CheckpointCorruption, EditedManifestValueIsDetected) {
  const std::vector<std::pair<const char*, std::function<void(nlohmann::json&)>>> edits = {
      {"meta step", [](nlohmann::json& m) { m["meta"]["step"] = m["meta"]["step"].get<int>() + 1; }},
      {"meta model", [](nlohmann::json& m) { m["meta"]["model"]["n_layer"] = 3; }},
      {"created_unix", [](nlohmann::json& m) { m["created_unix"] = m["created_unix"].get<double>() + 1; }},
      {"piece crc", [](nlohmann::json& m) { m["files"][0]["pieces"][0]["crc32c"][0] = 7; }},
  };
  for (const auto& [what, edit] : edits) {
    SCOPED_TRACE(what);
    TwoCheckpoints c;
    const std::string path = c.newest + "/manifest.json";
    nlohmann::json m = nlohmann::json::parse(testing::file_bytes(path));
    testing::write_bytes(path, m.dump(4));
    EXPECT_NO_THROW(verify(c.newest)) << "a reformatted manifest with the same values";
    edit(m);
    testing::write_bytes(path, m.dump(1));
    c.expect_detected_and_skipped("manifest checksum mismatch");
  }
  TwoCheckpoints c;
  const std::string path = c.newest + "/manifest.json";
  nlohmann::json m = nlohmann::json::parse(testing::file_bytes(path));
  m.erase("manifest_crc32c");
  testing::write_bytes(path, m.dump(1));
  c.expect_detected_and_skipped("has no manifest_crc32c");
}

// `ckpt ls` reads every byte of what it lists: a flipped byte in a rank file shows as damaged.
TEST(CheckpointCorruption, ListingReportsADamagedCheckpoint) {
  TwoCheckpoints c;
  damage(c.newest);
  char ls[] = "ls";
  char* argv[] = {ls, c.dir.data()};
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(ckpt_cli(2, argv), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  const size_t newest = out.find("step_000020"), older = out.find("step_000010");
  ASSERT_NE(newest, std::string::npos) << out;
  ASSERT_NE(older, std::string::npos) << out;
  const std::string newest_line = out.substr(newest, out.find('\n', newest) - newest);
  const std::string older_line = out.substr(older, out.find('\n', older) - older);
  EXPECT_NE(newest_line.find("DAMAGED: " + c.newest + "/rank_00000.bin: checksum mismatch"), std::string::npos) << out;
  EXPECT_NE(older_line.find("ok, verified"), std::string::npos) << out;
}

// Checkpoints, but none verifies: an error naming each one and why (not "nothing to resume", which
// a trainer would take for a fresh start), and nothing is touched. No checkpoint at all: nullopt.
TEST(CheckpointCorruption, NoCheckpointVerifyingIsAnErrorNamingEach) {
  TwoCheckpoints c;
  fs::remove(c.newest + "/rank_00001.bin");
  const std::string old_file = c.dir + "/step_000010/rank_00000.bin";
  fs::resize_file(old_file, fs::file_size(old_file) - 3);
  testing::CapturedLog log;
  parallel::SelfComm self;
  try {
    find_latest_valid(c.dir, self, log.logger);
    ADD_FAILURE() << "no checkpoint verifies, yet none was refused";
  } catch (const parallel::CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("none of the 2 checkpoint(s) in " + c.dir + " verifies"), std::string::npos) << what;
    EXPECT_NE(what.find("step_000020 (opening " + c.newest + "/rank_00001.bin: No such file"), std::string::npos) << what;
    EXPECT_NE(what.find("step_000010 (" + old_file + " has"), std::string::npos) << what;
    EXPECT_NE(what.find("truncated"), std::string::npos) << what;
  }
  EXPECT_TRUE(fs::exists(c.newest) && fs::exists(c.dir + "/step_000010"));
  EXPECT_FALSE(find_latest_valid(c.dir + "/absent", self, log.logger).has_value());  // a fresh run
  fs::create_directory(c.dir + "/empty");
  EXPECT_FALSE(find_latest_valid(c.dir + "/empty", self, log.logger).has_value());
}

TEST(CheckpointCorruption, UnknownFormatVersionIsRefusedByName) {
  TwoCheckpoints c;
  const std::string path = c.newest + "/manifest.json";
  nlohmann::json m = nlohmann::json::parse(testing::file_bytes(path));
  m["version"] = 99;
  testing::write_bytes(path, m.dump());
  try {
    Reader r(c.newest);
    ADD_FAILURE() << "a version-99 checkpoint was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("format version 99 is not supported"), std::string::npos) << e.what();
  }
  c.expect_detected_and_skipped("version 99");
}

TEST(CheckpointCorruption, PathsThatAreNotCheckpointsAreClearErrors) {
  TwoCheckpoints c;
  auto message = [](const std::string& path) -> std::string {
    try {
      Reader r(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(c.dir).find("is a checkpoint root, not a checkpoint"), std::string::npos) << message(c.dir);
  const std::string empty = c.dir + "/empty";
  fs::create_directory(empty);
  EXPECT_NE(message(empty).find("is not a checkpoint (no manifest.json"), std::string::npos) << message(empty);
  EXPECT_NE(message(c.dir + "/latest").find("not a directory"), std::string::npos) << message(c.dir + "/latest");
  const std::string foreign = c.dir + "/foreign";
  fs::create_directory(foreign);
  testing::write_bytes(foreign + "/manifest.json", R"({"format": "something-else", "version": 1})");
  EXPECT_NE(message(foreign).find("is not a minitrain checkpoint manifest"), std::string::npos) << message(foreign);
}

TEST(CheckpointCorruption, CheckpointOfAnotherModelShapeIsNamedTensorByTensor) {
  TwoCheckpoints c;
  const Reader r(c.newest);
  EXPECT_NO_THROW(r.check_tensors(c.s.tensors));
  std::vector<TensorInfo> other = c.s.tensors;
  other[1].global_shape.back() += 1;
  try {
    r.check_tensors(other);
    ADD_FAILURE() << "a mismatched shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor '" + other[1].name + "'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("does not fit this model"), std::string::npos) << e.what();
  }
  other = c.s.tensors;
  other.push_back({"param/extra", {3}, DType::f32});
  EXPECT_THROW(r.check_tensors(other), Error);
}

}  // namespace
}  // namespace mt::checkpoint
