// Box pieces: a tensor-parallel rank's block of a tensor (a column split: one row segment per row),
// possibly cut again by ZeRO into a flat range of the block, stored as one piece with its geometry.
// They read back bit for bit in any range; blocks that leave a hole are refused by the coverage
// check; a byte flipped inside a box is caught by reads that start in the middle of its chunk.
#include <gtest/gtest.h>

#include <random>

#include "checkpoint/checkpointer.h"
#include "checkpoint/reader.h"
#include "parallel/self_comm.h"
#include "tests/test_checkpoint_util.h"
#include "tests/test_util.h"

namespace mt::checkpoint {
namespace {

constexpr int64_t kRows = 37, kCols = 48, kParts = 4;

struct Split {
  std::vector<float> whole;  // (kRows, kCols)
  std::vector<std::vector<float>> blocks;  // part r: columns [r c, (r + 1) c), row-major in the block
};

Split random_split(std::mt19937_64& rng) {
  Split s;
  s.whole = mt::testing::random_floats(size_t(kRows * kCols), rng);
  const int64_t c = kCols / kParts;
  for (int64_t r = 0; r < kParts; r++) {
    s.blocks.emplace_back();
    for (int64_t i = 0; i < kRows; i++)
      for (int64_t j = 0; j < c; j++) s.blocks.back().push_back(s.whole[size_t(i * kCols + r * c + j)]);
  }
  return s;
}

// Saves the blocks (all but `skip`), block r cut at `cut` into two box pieces as ZeRO would.
std::string save_blocks(const Split& s, int skip, int64_t cut) {
  const std::string dir = mt::testing::make_temp_dir("ckpt_box");
  SaveRequest req;
  req.step = 3;
  req.tensors = {{"param/w", {kRows, kCols}, DType::f32}};
  const int64_t c = kCols / kParts, n = kRows * c;
  for (int64_t r = 0; r < kParts; r++) {
    if (r == skip) continue;
    const std::vector<int64_t> off = {0, r * c}, ext = {kRows, c};
    req.pieces.push_back({"param/w", 0, cut, s.blocks[size_t(r)].data(), off, ext});
    req.pieces.push_back({"param/w", cut, n, s.blocks[size_t(r)].data() + cut, off, ext});
  }
  parallel::SelfComm self;
  Options o;
  o.dir = dir;
  o.async = false;
  o.log = Logger(LogLevel::warn);
  Checkpointer ck(o, self);
  ck.save(req);
  ck.wait();
  return dir + "/step_000003";
}

TEST(CheckpointBoxes, BoxPiecesReadBackBitwiseInAnyRange) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const Split s = random_split(rng);
  const std::string path = save_blocks(s, -1, 101);
  const Reader r(path);
  ASSERT_TRUE(r.manifest().files[0].pieces[0].is_box()) << "stored as runs, not as a box";
  EXPECT_EQ(r.manifest().files[0].pieces.size(), size_t(2 * kParts));
  EXPECT_NO_THROW(verify(path));
  std::vector<float> all(s.whole.size());
  r.read("param/w", 0, kRows * kCols, all.data());
  EXPECT_EQ(all, s.whole);
  for (int k = 0; k < 50; k++) {
    int64_t a = int64_t(rng() % uint64_t(kRows * kCols + 1)), b = int64_t(rng() % uint64_t(kRows * kCols + 1));
    if (a > b) std::swap(a, b);
    std::vector<float> got(size_t(b - a));
    r.read("param/w", a, b, got.data());
    ASSERT_EQ(got, std::vector<float>(s.whole.begin() + a, s.whole.begin() + b)) << "[" << a << ", " << b << ")";
  }
}

// The save itself refuses pieces that do not cover every tensor (the commit's coverage check), so no
// such checkpoint is ever committed.
TEST(CheckpointBoxes, BlocksThatLeaveAHoleAreRefused) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const Split s = random_split(rng);
  try {
    save_blocks(s, 2, 50);  // columns [24, 36) missing in every row
    ADD_FAILURE() << "a checkpoint with a hole was committed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("elements [24, 36) are held by no file"), std::string::npos) << e.what();
  }
}

TEST(CheckpointBoxes, BoxOutsideItsTensorIsRefusedAtSave) {
  std::vector<float> v(12, 1.f);
  SaveRequest req;
  req.tensors = {{"param/w", {4, 6}, DType::f32}};
  req.pieces.push_back({"param/w", 0, 12, v.data(), {0, 4}, {4, 3}});  // columns 4..6 of 6
  parallel::SelfComm self;
  Options o;
  o.dir = mt::testing::make_temp_dir("ckpt_box_bad");
  o.async = false;
  o.log = Logger(LogLevel::warn);
  Checkpointer ck(o, self);
  try {
    ck.save(req);
    ADD_FAILURE() << "a box leaving its tensor was saved";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("leaves the tensor along dimension 1"), std::string::npos) << e.what();
  }
}

// Row-by-row reads of a box start and end inside checksum chunks; a flipped byte anywhere in the
// box must still fail them (a reader that checked only whole chunks, or trusted a cached chunk it
// never verified, would return the corrupted value).
TEST(CheckpointBoxes, AFlippedByteFailsRowByRowReads) {
  std::mt19937_64 rng(mt::testing::test_seed());
  const Split s = random_split(rng);
  const std::string path = save_blocks(s, -1, kRows * kCols / kParts);  // one piece per block
  const PieceRecord p = Reader(path).manifest().files[0].pieces[2];  // block 1, whole
  const std::string file = path + "/rank_00000.bin";
  std::string bytes = testing::file_bytes(file);
  const uint64_t at = p.offset + rng() % p.length;
  bytes[size_t(at)] = char(bytes[size_t(at)] ^ (1 << (rng() % 8)));
  testing::write_bytes(file, bytes);
  const Reader r(path);
  bool failed = false;
  std::vector<float> row(static_cast<size_t>(kCols));
  for (int64_t i = 0; i < kRows && !failed; i++) {
    try {
      r.read("param/w", i * kCols, (i + 1) * kCols, row.data());
    } catch (const Error& e) {
      failed = true;
      EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(failed) << "byte " << at << " flipped, every row read without error";
}

}  // namespace
}  // namespace mt::checkpoint
