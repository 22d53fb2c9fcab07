// The loader: resumable state, dp-size changes, prefetch, mixtures, validation split, bad configs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "data/loader.h"
#include "data/shard.h"
#include "runtime/check.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace mt::data;

namespace {

constexpr uint32_t kVocab = 700, kEot = 699;

// Writes `tokens` worth of random documents as shards <split>_*.bin in dir.
void write_split(const std::string& dir, const std::string& split, std::mt19937_64& rng, uint64_t tokens,
                 int shards) {
  std::uniform_int_distribution<int32_t> id(0, int32_t(kEot) - 1);
  for (int s = 0; s < shards; s++) {
    ShardBuilder b(kVocab, kEot);
    while (b.num_tokens() < tokens / uint64_t(shards)) {
      std::vector<int32_t> doc(1 + rng() % 60);
      for (auto& t : doc) t = id(rng);
      b.add_document(doc);
    }
    b.write(dir + "/" + split + "_" + std::to_string(s) + ".bin");
  }
}

LoaderConfig config(const std::string& src, int B, int T, uint64_t seed, int prefetch = 2) {
  LoaderConfig c;
  c.sources = {{src, 1.0}};
  c.B = B;
  c.T = T;
  c.seed = seed;
  c.doc_mask = true;
  c.prefetch = prefetch;
  return c;
}

void expect_same(const Batch& a, const Batch& b, const std::string& where) {
  ASSERT_EQ(a.inputs, b.inputs) << where;
  ASSERT_EQ(a.targets, b.targets) << where;
  ASSERT_EQ(a.doc_ids, b.doc_ids) << where;
  ASSERT_EQ(a.positions, b.positions) << where;
  ASSERT_EQ(a.row_window, b.row_window) << where;
  ASSERT_EQ(a.row_dataset, b.row_dataset) << where;
}

// (dataset, epoch, window) of every row, in row order.
using Row = std::tuple<uint32_t, uint64_t, uint64_t>;
void append_rows(const Batch& b, std::vector<Row>& out) {
  for (int r = 0; r < b.B; r++) out.emplace_back(b.row_dataset[size_t(r)], b.row_epoch[size_t(r)], b.row_window[size_t(r)]);
}

class LoaderTest : public ::testing::Test {
 protected:
  std::mt19937_64 rng{mt::testing::test_seed()};
  std::string dir = mt::testing::make_temp_dir("mt_loader");
  uint64_t seed = rng();
  void SetUp() override {
    write_split(dir, "train", rng, 20000, 3);
    write_split(dir, "val", rng, 3000, 1);
  }
  void TearDown() override { fs::remove_all(dir); }
};

}  // namespace

TEST_F(LoaderTest, ResumeAfter40BatchesGivesTheSameNext8) {
  Loader a(config(dir, 4, 32, seed));
  Batch b;
  for (int i = 0; i < 40; i++) a.next(b);
  nlohmann::json state = a.state();
  EXPECT_EQ(state["position"].get<uint64_t>(), 160u);
  std::vector<Batch> ref(8);
  for (auto& r : ref) a.next(r);
  Loader fresh(config(dir, 4, 32, seed));
  fresh.restore(nlohmann::json::parse(state.dump()));  // through text, as a checkpoint stores it
  for (int i = 0; i < 8; i++) {
    fresh.next(b);
    expect_same(b, ref[size_t(i)], "batch " + std::to_string(40 + i));
  }
}

TEST_F(LoaderTest, ResumeAcrossAnEpochBoundaryReshufflesIdentically) {
  const int T = 32;
  uint64_t W = Loader(config(dir, 1, T, seed, 0)).num_windows();
  const int B = int(W / 44);  // epoch 0 ends during batch 45 or 46: after the save at 40, before 48
  ASSERT_GE(B, 1);
  Loader a(config(dir, B, T, seed));
  Batch b;
  std::set<uint64_t> epoch0;
  for (int i = 0; i < 40; i++) {
    a.next(b);
    for (int r = 0; r < B; r++) ASSERT_TRUE(epoch0.insert(b.row_window[size_t(r)]).second) << "repeat in epoch 0";
  }
  nlohmann::json state = a.state();
  std::vector<Batch> ref(8);
  for (auto& r : ref) a.next(r);
  EXPECT_EQ(ref.back().row_epoch.back(), 1u) << "the 8 batches after the save must reach epoch 1";
  EXPECT_EQ(a.epoch(), 1u);
  Loader fresh(config(dir, B, T, seed));
  fresh.restore(state);
  for (int i = 0; i < 8; i++) {
    fresh.next(b);
    expect_same(b, ref[size_t(i)], "batch " + std::to_string(40 + i));
  }
}

TEST_F(LoaderTest, ChangingDpSizeOnRestoreContinuesTheGlobalSequence) {
  const int T = 16, global_rows = 6;
  // Reference: one rank reading all 6 rows of every global micro-batch.
  Loader single(config(dir, global_rows, T, seed));
  std::vector<Row> expect;
  Batch b;
  for (int i = 0; i < 30; i++) {
    single.next(b);
    append_rows(b, expect);
  }
  // 10 steps with dp = 2 (3 rows each), then resume with dp = 3 (2 rows each), then dp = 1.
  std::vector<Row> got;
  auto run = [&](int D, int steps, const nlohmann::json* from) {
    std::vector<std::unique_ptr<Loader>> ranks;
    for (int r = 0; r < D; r++) {
      LoaderConfig c = config(dir, global_rows / D, T, seed);
      c.dp_rank = r;
      c.dp_size = D;
      ranks.push_back(std::make_unique<Loader>(c));
      if (from) ranks.back()->restore(*from);
    }
    for (int s = 0; s < steps; s++)
      for (auto& l : ranks) {
        l->next(b);
        append_rows(b, got);
      }
    for (auto& l : ranks) EXPECT_EQ(l->state(), ranks[0]->state()) << "every rank holds the same state";
    return ranks[0]->state();
  };
  nlohmann::json s1 = run(2, 10, nullptr);
  nlohmann::json s2 = run(3, 10, &s1);
  run(1, 10, &s2);
  ASSERT_EQ(got.size(), expect.size());
  for (size_t i = 0; i < got.size(); i++) ASSERT_EQ(got[i], expect[i]) << "row " << i << ": duplicate or gap";
}

TEST_F(LoaderTest, PrefetchedSequenceEqualsSynchronousSequence) {
  Loader sync(config(dir, 3, 24, seed, 0)), pre(config(dir, 3, 24, seed, 3));
  Batch a, b;
  for (int i = 0; i < 30; i++) {
    sync.next(a);
    pre.next(b);
    expect_same(a, b, "batch " + std::to_string(i));
    ASSERT_EQ(sync.state(), pre.state());
  }
  // Restoring mid-stream discards what the prefetch thread had queued.
  nlohmann::json s = sync.state();
  for (int i = 0; i < 5; i++) pre.next(b);
  pre.restore(s);
  sync.next(a);
  pre.next(b);
  expect_same(a, b, "after restore");
  EXPECT_GE(pre.wait_seconds(), 0.0);
}

TEST_F(LoaderTest, MixtureIsDeterministicProportionalAndResumable) {
  std::string other = mt::testing::make_temp_dir("mt_loader_b");
  write_split(other, "train", rng, 8000, 2);
  LoaderConfig c = config(dir, 8, 16, seed);
  c.sources = parse_mixture(dir + ":0.7," + other + ":0.3");
  ASSERT_EQ(c.sources.size(), 2u);
  EXPECT_DOUBLE_EQ(c.sources[1].weight, 0.3);
  Loader a(c), again(c);
  Batch x, y;
  uint64_t rows = 0, from_a = 0;
  for (int i = 0; i < 300; i++) {
    a.next(x);
    again.next(y);
    expect_same(x, y, "batch " + std::to_string(i));
    for (uint32_t d : x.row_dataset) from_a += d == 0;
    rows += uint64_t(x.B);
    for (int r = 0; r < x.B; r++) {  // the row really comes from the dataset it names
      const Dataset& ds = a.dataset(x.row_dataset[size_t(r)]);
      std::vector<int32_t> w(17);
      ds.read(x.row_window[size_t(r)] * 16, 17, w.data());
      ASSERT_TRUE(std::equal(w.begin(), w.end() - 1, x.inputs.begin() + r * 16));
    }
  }
  double sd = std::sqrt(rows * 0.7 * 0.3);
  EXPECT_NEAR(double(from_a), 0.7 * rows, 5 * sd);
  nlohmann::json s = a.state();
  a.next(x);
  Loader resumed(c);
  resumed.restore(s);
  resumed.next(y);
  expect_same(x, y, "mixture resume");
  LoaderConfig changed = c;
  changed.sources[1].weight = 0.5;
  Loader other_weights(changed);
  EXPECT_THROW(other_weights.restore(s), mt::Error);
  fs::remove_all(other);
}

TEST_F(LoaderTest, ValidationSplitReadsHeldOutShardsAndRewinds) {
  LoaderConfig c = config(dir, 2, 32, seed);
  c.split = Split::val;
  c.mode = SampleMode::sequential;
  Loader val(c);
  Loader train(config(dir, 2, 32, seed));
  EXPECT_LT(val.num_tokens(), train.num_tokens() / 3);
  Batch first, b;
  val.next(first);
  EXPECT_EQ(first.row_window, (std::vector<uint64_t>{0, 1}));
  for (int i = 0; i < 5; i++) val.next(b);
  val.rewind();
  val.next(b);
  expect_same(b, first, "after rewind");
}

TEST_F(LoaderTest, BadConfigsAndMismatchesFailWithClearMessages) {
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const mt::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message([&] { Loader l(config(dir + "/nope", 2, 32, seed)); }).find("nope"), std::string::npos);
  EXPECT_NE(message([&] { Loader l(config(dir, 2, 1000000, seed)); }).find("fewer than sequence length"),
            std::string::npos);
  EXPECT_NE(message([&] { Loader l(config(dir, 0, 32, seed)); }).find("batch rows"), std::string::npos);
  LoaderConfig bad_rank = config(dir, 2, 32, seed);
  bad_rank.dp_rank = 2;
  bad_rank.dp_size = 2;
  EXPECT_NE(message([&] { Loader l(bad_rank); }).find("dp rank"), std::string::npos);
  Loader l(config(dir, 2, 32, seed));
  EXPECT_NO_THROW(l.check_model_vocab(int(kVocab)));
  EXPECT_NE(message([&] { l.check_model_vocab(50257); }).find("vocab"), std::string::npos);
  Loader other_T(config(dir, 2, 16, seed));
  EXPECT_NE(message([&] { other_T.restore(l.state()); }).find("sequence length"), std::string::npos);
  Loader other_seed(config(dir, 2, 32, seed + 1));
  EXPECT_NE(message([&] { other_seed.restore(l.state()); }).find("seed"), std::string::npos);
  EXPECT_THROW(parse_mixture("a:0.5,b:x"), mt::Error);
  EXPECT_THROW(parse_mixture("a:-1"), mt::Error);
  EXPECT_THROW(parse_mixture("a,,b"), mt::Error);
}

// A dataset manifest as `data prepare` writes it (the fields the loader reads): the train_*.bin
// shards of `dir` and the fingerprint of the tokenizer that made them.
static void write_meta(const std::string& dir, const std::string& fingerprint) {
  nlohmann::json shards = nlohmann::json::array();
  for (int s = 0; fs::exists(dir + "/train_" + std::to_string(s) + ".bin"); s++)
    shards.push_back({{"file", "train_" + std::to_string(s) + ".bin"}});
  nlohmann::json meta = {{"tokenizer_fingerprint", fingerprint},
                         {"splits", {{"train", {{"shards", shards}}}, {"val", {{"shards", nlohmann::json::array()}}}}}};
  std::ofstream(dir + "/meta.json") << meta.dump();
}

// Datasets made with different tokenizers (same vocabulary size) are refused in one mixture, naming
// both datasets and fingerprints; the same tokenizer, or a dataset that records none, is accepted.
TEST_F(LoaderTest, MixedDatasetsMustShareTheirTokenizer) {
  const std::string other = mt::testing::make_temp_dir("mt_loader_tok");
  write_split(other, "train", rng, 8000, 2);
  LoaderConfig c = config(dir, 2, 16, seed);
  c.sources = parse_mixture(dir + ":0.5," + other + ":0.5");
  EXPECT_NO_THROW(Loader l(c)) << "no fingerprint recorded: nothing to compare";
  write_meta(dir, "00000000000000aa");
  EXPECT_NO_THROW(Loader l(c)) << "one fingerprint recorded";
  write_meta(other, "00000000000000aa");
  EXPECT_NO_THROW(Loader l(c)) << "the same tokenizer";
  write_meta(other, "00000000000000bb");
  for (const std::string& second : {other, other + "/train_1.bin"}) {  // a dataset, or one shard of it
    c.sources = parse_mixture(dir + ":0.5," + second + ":0.5");
    try {
      Loader l(c);
      ADD_FAILURE() << "datasets of two tokenizers were mixed";
    } catch (const mt::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(second + " (tokenizer fingerprint 00000000000000bb)"), std::string::npos) << m;
      EXPECT_NE(m.find(dir + " (tokenizer fingerprint 00000000000000aa)"), std::string::npos) << m;
    }
  }
  fs::remove_all(other);
}

// A dataset listed twice in a mixture (under the same or another spelling) is refused by name.
TEST_F(LoaderTest, MixtureNamingADatasetTwiceIsRefused) {
  for (const std::string& again : {dir, dir + "/", dir + "/../" + fs::path(dir).filename().string()}) {
    try {
      parse_mixture(dir + ":0.7," + again + ":0.3");
      ADD_FAILURE() << again << " accepted beside " << dir;
    } catch (const mt::Error& e) {
      EXPECT_NE(std::string(e.what()).find("data.mix: '" + dir + "' and '" + again + "' name the same dataset"),
                std::string::npos) << e.what();
    }
  }
}

TEST_F(LoaderTest, DamagedShardIsReportedWhenTheLoaderOpens) {
  std::string victim = dir + "/train_1.bin";
  {
    std::FILE* f = std::fopen(victim.c_str(), "r+b");
    ASSERT_TRUE(f);
    // Flip the byte's bits: writing a fixed value leaves the shard intact when the byte already has
    // it (one seed in 256).
    std::fseek(f, long(kShardHeaderBytes) + 10, SEEK_SET);
    const int old = std::fgetc(f);
    ASSERT_NE(old, EOF);
    std::fseek(f, long(kShardHeaderBytes) + 10, SEEK_SET);
    std::fputc(old ^ 0xff, f);
    std::fclose(f);
  }
  try {
    Loader l(config(dir, 2, 32, seed));
    FAIL() << "a corrupt shard must not load";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
  }
}
