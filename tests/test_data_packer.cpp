// Packing: documents joined by EOT into windows of T+1, with document ids and restarting positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "data/dataset.h"
#include "data/packer.h"
#include "data/shard.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace mt::data;

TEST(Packer, HandExampleGivesDocIdsPositionsAndShiftedTargets) {
  const int32_t E = 9;
  // Stream: [E 1 2] [E 3 4 5] [E 6]   T = 8, the window is the whole stream (T+1 = 9 tokens).
  std::vector<int32_t> w = {E, 1, 2, E, 3, 4, 5, E, 6};
  std::vector<int> cuts = {3, 7};
  std::vector<int32_t> in(8), tg(8), doc(8), pos(8);
  pack_row(in.data(), tg.data(), doc.data(), pos.data(), w, cuts, 8);
  EXPECT_EQ(in, (std::vector<int32_t>{E, 1, 2, E, 3, 4, 5, E}));
  EXPECT_EQ(tg, (std::vector<int32_t>{1, 2, E, 3, 4, 5, E, 6}));
  EXPECT_EQ(doc, (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 1, 2}));
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3, 0}));
  // Without masking only inputs and targets are written.
  pack_row(in.data(), tg.data(), nullptr, nullptr, w, cuts, 8);
  EXPECT_EQ(tg.back(), 6);
}

namespace {

struct Corpus {
  std::vector<std::vector<int32_t>> docs;  // without their EOT
  std::vector<int32_t> stream;             // [EOT, doc...] for every doc, all shards in order
  std::vector<uint64_t> starts;            // stream offset of each doc's EOT
};

// Writes `shards` shards of random documents (lengths 0..maxlen) to dir/train_*.bin.
Corpus write_corpus(const std::string& dir, std::mt19937_64& rng, int docs, int shards, int maxlen,
                    uint32_t vocab, uint32_t eot) {
  Corpus c;
  std::uniform_int_distribution<int32_t> id(0, int32_t(vocab) - 2);  // eot is vocab - 1
  for (int s = 0; s < shards; s++) {
    ShardBuilder b(vocab, eot);
    for (int d = s * docs / shards; d < (s + 1) * docs / shards; d++) {
      std::vector<int32_t> doc(rng() % uint64_t(maxlen + 1));
      for (auto& t : doc) t = id(rng);
      c.starts.push_back(c.stream.size());
      c.stream.push_back(int32_t(eot));
      c.stream.insert(c.stream.end(), doc.begin(), doc.end());
      b.add_document(doc);
      c.docs.push_back(std::move(doc));
    }
    b.write(dir + "/train_" + std::to_string(100000 + s) + ".bin");
  }
  return c;
}

}  // namespace

TEST(Packer, MaskedRowsGiveEachWholeDocumentExactlyItsOwnRow) {
  std::mt19937_64 rng(mt::testing::test_seed());
  std::string dir = mt::testing::make_temp_dir("mt_pack");
  const uint32_t V = 1000, EOT = V - 1;
  Corpus c = write_corpus(dir, rng, 120, 3, 30, V, EOT);
  Dataset ds(dir, Split::train);
  ASSERT_EQ(ds.num_tokens(), c.stream.size());
  ASSERT_EQ(ds.num_docs(), c.docs.size());
  const int T = 17 + int(rng() % 40);
  const size_t Tn = static_cast<size_t>(T);
  std::vector<int32_t> window(Tn + 1), in(Tn), tg(Tn), doc(Tn), pos(Tn);
  std::vector<int> cuts;
  size_t whole_docs_checked = 0;
  for (uint64_t w = 0; w < ds.num_windows(T); w++) {
    const uint64_t begin = w * uint64_t(T);
    ds.read(begin, uint64_t(T) + 1, window.data());
    ASSERT_TRUE(std::equal(window.begin(), window.end(), c.stream.begin() + long(begin))) << "read across shards";
    cuts.clear();
    ds.doc_starts_in(begin, uint64_t(T) + 1, cuts);
    pack_row(in.data(), tg.data(), doc.data(), pos.data(), window, cuts, T);
    for (int t = 0; t < T; t++) {
      ASSERT_EQ(in[size_t(t)], c.stream[begin + uint64_t(t)]);
      ASSERT_EQ(tg[size_t(t)], c.stream[begin + uint64_t(t) + 1]) << "every next token is a target";
    }
    // Each document that lies wholly in the row (its EOT and tokens as inputs, the next EOT as the
    // last target) sees exactly the row it would have alone.
    for (size_t d = 0; d < c.docs.size(); d++) {
      uint64_t s = c.starts[d], e = s + 1 + c.docs[d].size();  // e: the next document's EOT
      if (s < begin || e > begin + uint64_t(T) || e >= c.stream.size()) continue;
      std::vector<int32_t> ai, at, ap;
      single_document_row(ai, at, ap, c.docs[d], int32_t(EOT));
      int32_t id = doc[s - begin];
      std::vector<int32_t> gi, gt, gp;
      for (int t = 0; t < T; t++)
        if (doc[size_t(t)] == id) {
          gi.push_back(in[size_t(t)]);
          gt.push_back(tg[size_t(t)]);
          gp.push_back(pos[size_t(t)]);
        }
      ASSERT_EQ(gi, ai) << "window " << w << " doc " << d;
      ASSERT_EQ(gt, at);
      ASSERT_EQ(gp, ap);
      whole_docs_checked++;
    }
    // Ids count documents from 0 and step by one exactly at each EOT-opened document.
    for (int t = 0; t < T; t++) {
      bool starts_doc = t > 0 && std::binary_search(c.starts.begin(), c.starts.end(), begin + uint64_t(t));
      int32_t expect_doc = t == 0 ? 0 : doc[size_t(t) - 1] + (starts_doc ? 1 : 0);
      ASSERT_EQ(doc[size_t(t)], expect_doc);
      ASSERT_EQ(pos[size_t(t)], starts_doc || t == 0 ? 0 : pos[size_t(t) - 1] + 1);
      ASSERT_LT(pos[size_t(t)], T);
    }
  }
  EXPECT_GT(whole_docs_checked, 20u) << "the corpus should have many documents shorter than T";
  fs::remove_all(dir);
}

TEST(Packer, WindowsShareOneTokenSoEveryTokenIsATargetOnce) {
  std::mt19937_64 rng(mt::testing::test_seed());
  std::string dir = mt::testing::make_temp_dir("mt_pack");
  Corpus c = write_corpus(dir, rng, 40, 2, 20, 300, 299);
  Dataset ds(dir, Split::train);
  const int T = 8;
  EXPECT_EQ(ds.num_windows(T), (c.stream.size() - 1) / T);
  // Concatenating the rows' targets (inputs) gives the stream from token 1 (0) with nothing skipped.
  std::vector<int32_t> window(T + 1), in(T), tg(T), all_in, all_tg;
  for (uint64_t w = 0; w < ds.num_windows(T); w++) {
    ds.read(w * T, T + 1, window.data());
    pack_row(in.data(), tg.data(), nullptr, nullptr, window, {}, T);
    all_in.insert(all_in.end(), in.begin(), in.end());
    all_tg.insert(all_tg.end(), tg.begin(), tg.end());
  }
  size_t n = all_tg.size();
  EXPECT_TRUE(std::equal(all_tg.begin(), all_tg.end(), c.stream.begin() + 1));
  EXPECT_TRUE(std::equal(all_in.begin(), all_in.end(), c.stream.begin()));
  EXPECT_LE(c.stream.size() - 1 - n, size_t(T - 1)) << "only the tail shorter than a window is left out";
  fs::remove_all(dir);
}
