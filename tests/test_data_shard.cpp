// Token shard format: round trips, and every way a shard can be damaged is caught and named.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "data/shard.h"
#include "runtime/check.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace mt::data;

namespace {

struct Stream {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> starts;
};

// Random documents, each [EOT, tokens...], with ids below vocab.
Stream random_stream(std::mt19937_64& rng, uint32_t vocab, uint32_t eot, int docs) {
  Stream s;
  std::uniform_int_distribution<int> len(0, 40);
  std::uniform_int_distribution<int32_t> id(0, int32_t(vocab) - 1);
  for (int d = 0; d < docs; d++) {
    s.starts.push_back(s.tokens.size());
    s.tokens.push_back(int32_t(eot));
    for (int i = len(rng); i > 0; i--) s.tokens.push_back(id(rng));
  }
  return s;
}

std::vector<unsigned char> slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void spit(const std::string& p, const std::vector<unsigned char>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// The message of the mt::Error that opening `path` throws ("" if none).
std::string open_error(const std::string& path) {
  try {
    Shard s(path);
  } catch (const mt::Error& e) {
    return e.what();
  }
  return "";
}

class ShardTest : public ::testing::Test {
 protected:
  std::string dir = mt::testing::make_temp_dir("mt_shard");
  std::mt19937_64 rng{mt::testing::test_seed()};
  void TearDown() override { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return dir + "/" + name; }
};

}  // namespace

TEST(Crc32, MatchesTheStandardCheckValue) {
  // The CRC-32/ISO-HDLC check value of "123456789" (the value zlib.crc32 gives).
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);
  // Continuing over split buffers equals one pass, at every split point.
  std::mt19937_64 rng(mt::testing::test_seed());
  std::vector<unsigned char> buf(1000);
  for (auto& b : buf) b = uint8_t(rng());
  uint32_t whole = crc32(buf.data(), buf.size());
  for (size_t cut : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(333), size_t(999)})
    EXPECT_EQ(crc32(buf.data() + cut, buf.size() - cut, crc32(buf.data(), cut)), whole) << "cut " << cut;
}

TEST_F(ShardTest, RoundTripsTokensAndDocumentIndexAtBothWidths) {
  for (uint32_t vocab : {300u, 65536u, 70000u}) {
    uint32_t eot = vocab - 1;
    Stream s = random_stream(rng, vocab, eot, 57);
    std::string p = path("rt.bin");
    write_shard(p, s.tokens, s.starts, vocab, eot);
    Shard sh(p);
    EXPECT_EQ(sh.header().token_bytes, vocab <= 65536 ? 2u : 4u);
    EXPECT_EQ(sh.header().vocab_size, vocab);
    EXPECT_EQ(sh.header().eot_token, eot);
    ASSERT_EQ(sh.num_tokens(), s.tokens.size());
    ASSERT_EQ(sh.num_docs(), s.starts.size());
    std::vector<int32_t> back(s.tokens.size());
    sh.read(0, back.size(), back.data());
    EXPECT_EQ(back, s.tokens);
    for (size_t i = 0; i < s.starts.size(); i++) EXPECT_EQ(sh.doc_starts()[i], s.starts[i]);
    EXPECT_EQ(sh.token(5), s.tokens[5]);
    EXPECT_EQ(fs::file_size(p), shard_file_bytes(sh.header()));
  }
}

TEST_F(ShardTest, BuilderPrefixesEachDocumentWithEot) {
  ShardBuilder b(100, 99);
  b.add_document(std::vector<int32_t>{1, 2, 3});
  b.add_document(std::vector<int32_t>{});
  b.add_document(std::vector<int32_t>{4});
  b.write(path("b.bin"));
  Shard sh(path("b.bin"));
  std::vector<int32_t> t(sh.num_tokens());
  sh.read(0, t.size(), t.data());
  EXPECT_EQ(t, (std::vector<int32_t>{99, 1, 2, 3, 99, 99, 4}));
  ASSERT_EQ(sh.num_docs(), 3u);
  EXPECT_EQ(sh.doc_starts()[1], 4u);
  EXPECT_EQ(sh.doc_starts()[2], 5u);
}

TEST_F(ShardTest, WriterRejectsOutOfVocabIdsAndLeavesNoFile) {
  Stream s = random_stream(rng, 500, 499, 5);
  s.tokens.back() = 500;
  EXPECT_THROW(write_shard(path("bad.bin"), s.tokens, s.starts, 500, 499), mt::Error);
  EXPECT_TRUE(fs::is_empty(dir)) << "no partial or temporary file may remain";
}

TEST_F(ShardTest, EveryKindOfDamageIsReportedWithTheFileName) {
  Stream s = random_stream(rng, 1000, 999, 20);
  std::string good = path("good.bin");
  write_shard(good, s.tokens, s.starts, 1000, 999);
  const auto bytes = slurp(good);
  struct Case {
    const char* name;
    std::function<void(std::vector<unsigned char>&)> damage;
    const char* expect;
  };
  std::uniform_int_distribution<size_t> any_body(kShardHeaderBytes, bytes.size() - 1);
  std::vector<Case> cases = {
      {"truncated body", [](auto& b) { b.resize(b.size() - 3); }, "truncated"},
      {"truncated header", [](auto& b) { b.resize(20); }, "truncated"},
      {"empty file", [](auto& b) { b.clear(); }, "truncated"},
      {"trailing bytes", [](auto& b) { b.push_back(0); }, "trailing"},
      {"wrong magic", [](auto& b) { b[0] = 'X'; }, "magic"},
      {"wrong version", [](auto& b) { b[8] = 7; }, "version"},
      {"header bit flip", [](auto& b) { b[17] ^= 1; }, "header checksum"},
      {"body bit flip", [&](auto& b) { b[any_body(rng)] ^= uint8_t(1 << (rng() % 8)); }, "checksum"},
  };
  for (const Case& c : cases) {
    auto b = bytes;
    c.damage(b);
    std::string p = path(std::string(c.name) + ".bin");
    spit(p, b);
    std::string err = open_error(p);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find(p), std::string::npos) << c.name << " must name the file: " << err;
  }
}

TEST_F(ShardTest, TokenIdAtOrAboveVocabIsRejectedEvenWithAValidChecksum) {
  // A foreign writer that stored an id >= vocab but computed correct checksums.
  Stream s = random_stream(rng, 1000, 999, 10);
  std::string p = path("big_id.bin");
  write_shard(p, s.tokens, s.starts, 1000, 999);
  auto b = slurp(p);
  size_t at = 3 + rng() % (s.tokens.size() - 3);
  uint16_t big = 1000 + uint16_t(rng() % 100);
  std::memcpy(&b[kShardHeaderBytes + 2 * at], &big, 2);
  uint32_t crc = crc32(b.data() + kShardHeaderBytes, b.size() - kShardHeaderBytes);
  std::memcpy(&b[40], &crc, 4);
  uint32_t hcrc = crc32(b.data(), 60);
  std::memcpy(&b[60], &hcrc, 4);
  spit(p, b);
  std::string err = open_error(p);
  EXPECT_NE(err.find(">= the vocab size"), std::string::npos) << err;
}

TEST_F(ShardTest, HeaderOnlyReadChecksMagicAndHeaderCrc) {
  Stream s = random_stream(rng, 300, 0, 4);
  std::string p = path("h.bin");
  write_shard(p, s.tokens, s.starts, 300, 0);
  ShardHeader h = read_shard_header(p);
  EXPECT_EQ(h.num_tokens, s.tokens.size());
  EXPECT_EQ(h.num_docs, 4u);
  EXPECT_THROW(read_shard_header(path("missing.bin")), mt::Error);
}

// scripts/shards.py (numpy) reads what C++ writes and writes what C++ reads. Skipped when the
// system Python with numpy is not installed.
TEST_F(ShardTest, NumpyScriptInteroperates) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3+numpy";
  Stream s = random_stream(rng, 70000, 69999, 30);
  std::string cpp = path("cpp.bin"), py = path("py.bin");
  write_shard(cpp, s.tokens, s.starts, 70000, 69999);
  std::string cmd = std::string("/usr/bin/python3 ") + MT_SOURCE_DIR + "/scripts/shards.py copy " + cpp + " " + py;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  Shard a(py);
  std::vector<int32_t> back(a.num_tokens());
  a.read(0, back.size(), back.data());
  EXPECT_EQ(back, s.tokens);
  EXPECT_EQ(slurp(py), slurp(cpp)) << "numpy writer must produce byte-identical shards";
  // And the numpy reader rejects damage as the C++ reader does.
  auto b = slurp(py);
  b[kShardHeaderBytes + 1] ^= 4;
  spit(py, b);
  cmd = std::string("/usr/bin/python3 ") + MT_SOURCE_DIR + "/scripts/shards.py info " + py + " >/dev/null 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
}
