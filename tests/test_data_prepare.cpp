// `data prepare` / `data inspect`: documents, shards, reuse, bad input, and the CLI.
#include <gtest/gtest.h>

#include <functional>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "data/dataset.h"
#include "data/documents.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/pretokenize.h"
#include "data/tokenizer.h"
#include "runtime/check.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace mt::data;

namespace {

const mt::Logger kQuiet(mt::LogLevel::error);

// A document of random words; the first is never the whitespace-only "\t" (the last word), so no
// document is blank (`data prepare` skips blank documents by design).
std::string random_text(std::mt19937_64& rng, int words) {
  static const char* w[] = {"the", "cat", "sat", "on", "a", "mat", "Don't", "panic!", "42", "naïve", "日本",
                            "\xff\xfe", "-- Mark Twain", "fortune", "\t"};
  std::string s;
  for (int i = 0; i < words; i++)
    s += std::string(i ? (rng() % 6 ? " " : "\n") : "") + w[rng() % (std::size(w) - (i ? 0 : 1))];
  return s + "\n";
}

// Writes a fortune database of `docs` random fortunes; returns their texts.
std::vector<std::string> write_fortunes(const std::string& path, std::mt19937_64& rng, int docs) {
  std::vector<std::string> out;
  std::ofstream f(path, std::ios::binary);
  for (int i = 0; i < docs; i++) {
    out.push_back(random_text(rng, 3 + int(rng() % 25)));
    f << out.back() << "%\n";
  }
  return out;
}

// The documents of a split, decoded: each stored document minus its leading EOT.
std::vector<std::string> decode_split(const std::string& dir, Split split, const Tokenizer& tok) {
  Dataset ds(dir, split);
  std::vector<std::string> docs;
  for (size_t s = 0; s < ds.num_shards(); s++) {
    const Shard& sh = ds.shard(s);
    for (uint64_t d = 0; d < sh.num_docs(); d++) {
      uint64_t b = sh.doc_starts()[d], e = d + 1 < sh.num_docs() ? sh.doc_starts()[d + 1] : sh.num_tokens();
      std::vector<int32_t> ids(e - b);
      sh.read(b, e - b, ids.data());
      EXPECT_EQ(ids[0], tok.eot_token());
      docs.push_back(tok.decode(std::span<const int32_t>(ids).subspan(1)));
    }
  }
  return docs;
}

class PrepareTest : public ::testing::Test {
 protected:
  std::mt19937_64 rng{mt::testing::test_seed()};
  std::string dir = mt::testing::make_temp_dir("mt_prep");
  std::string in = dir + "/in", out = dir + "/out";
  std::vector<std::string> docs;
  void SetUp() override {
    fs::create_directories(in + "/sub");
    for (const char* name : {"/alpha", "/sub/beta"}) {
      auto d = write_fortunes(in + name, rng, 60 + int(rng() % 40));
      docs.insert(docs.end(), d.begin(), d.end());
    }
    std::ofstream(in + "/alpha.dat") << "\x01\x02 binary strfile index";  // must be skipped
    fs::create_symlink(in + "/alpha", in + "/sub/alpha.u8");            // duplicate via symlink
  }
  void TearDown() override { fs::remove_all(dir); }
  PrepareOptions options() const {
    PrepareOptions o;
    o.inputs = {in};
    o.out_dir = out;
    o.splitter = Splitter::fortune;
    o.vocab_size = 320;
    o.val_fraction = 0.1;
    o.shard_tokens = 1500;
    return o;
  }
};

}  // namespace

TEST(Documents, SplittersCutAsDocumented) {
  std::vector<std::string> d;
  split_documents("a\n%\nb\nc\n%\n%\n  \n%\nd", Splitter::fortune, "x", d);
  EXPECT_EQ(d, (std::vector<std::string>{"a\n", "b\nc\n", "d"}));
  d.clear();
  split_documents("p1 l1\np1 l2\n\n\n  \np2\n", Splitter::paragraphs, "x", d);
  EXPECT_EQ(d, (std::vector<std::string>{"p1 l1\np1 l2\n", "p2\n"}));
  d.clear();
  split_documents("one\n\n two\r\n", Splitter::lines, "x", d);
  EXPECT_EQ(d, (std::vector<std::string>{"one", " two\r"}));
  d.clear();
  split_documents("{\"text\":\"hi\\nthere\"}\n\n{\"text\":\"x\",\"id\":3}\n", Splitter::jsonl, "x", d);
  EXPECT_EQ(d, (std::vector<std::string>{"hi\nthere", "x"}));
  EXPECT_THROW(split_documents("{\"no_text\":1}\n", Splitter::jsonl, "f.jsonl", d), mt::Error);
  EXPECT_THROW(splitter_from_name("csv"), mt::Error);
}

TEST_F(PrepareTest, InputsExpandOnceEachSkippingFortuneIndexes) {
  auto files = expand_inputs({in, in + "/alpha"}, Splitter::fortune);
  ASSERT_EQ(files.size(), 2u) << "alpha.dat skipped, alpha.u8 and the repeated alpha collapse";
  EXPECT_EQ(fs::path(files[0].path).filename(), "alpha");
  EXPECT_EQ(fs::path(files[1].path).filename(), "beta");
  EXPECT_EQ(expand_inputs({in + "/*"}, Splitter::fortune).size(), 1u) << "the glob matches files only";
}

TEST_F(PrepareTest, ShardsHoldEveryDocumentOnceWithAnExactValidationShare) {
  PrepareReport r = prepare_dataset(options(), kQuiet);
  EXPECT_FALSE(r.reused);
  EXPECT_EQ(r.train_docs + r.val_docs, docs.size());
  EXPECT_EQ(r.val_docs, uint64_t(std::llround(0.1 * double(docs.size()))));
  EXPECT_GT(r.train_shards, 1u) << "shard_tokens = 1500 must split the train data";
  Tokenizer tok = Tokenizer::load(out + "/tokenizer.json");
  EXPECT_EQ(tok.vocab_size(), r.vocab_size);
  auto train = decode_split(out, Split::train, tok), val = decode_split(out, Split::val, tok);
  // Interleave back in input order: document i went to val iff floor((i+1)n/D) > floor(i n/D).
  size_t ti = 0, vi = 0, n = val.size(), D = docs.size();
  for (size_t i = 0; i < D; i++) {
    bool is_val = (i + 1) * n / D > i * n / D;
    ASSERT_EQ(is_val ? val.at(vi++) : train.at(ti++), docs[i]) << "document " << i;
  }
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(out + "/meta.json"));
  EXPECT_EQ(meta["splits"]["train"]["docs"].get<uint64_t>(), r.train_docs);
  EXPECT_EQ(meta["vocab_size"].get<int>(), r.vocab_size);
  // The loader opens the directory through the manifest.
  LoaderConfig c;
  c.sources = {{out, 1}};
  c.B = 2;
  c.T = 16;
  Loader l(c);
  EXPECT_EQ(l.num_tokens(), r.train_tokens);
  EXPECT_EQ(l.vocab_size(), uint32_t(r.vocab_size));
}

TEST_F(PrepareTest, OutputIsIndependentOfTheThreadCount) {
  PrepareOptions o = options();
  o.threads = 1;
  prepare_dataset(o, kQuiet);
  o.threads = 3;
  o.out_dir = dir + "/out3";
  prepare_dataset(o, kQuiet);
  for (const char* f : {"/train_000000.bin", "/train_000001.bin", "/val_000000.bin", "/tokenizer.json"}) {
    std::ifstream a(out + f, std::ios::binary), b(o.out_dir + f, std::ios::binary);
    std::string sa{std::istreambuf_iterator<char>(a), {}}, sb{std::istreambuf_iterator<char>(b), {}};
    EXPECT_FALSE(sa.empty()) << f;
    EXPECT_EQ(sa, sb) << f;
  }
}

TEST_F(PrepareTest, RerunReusesOutputsAndAChangedInputRebuilds) {
  PrepareReport first = prepare_dataset(options(), kQuiet);
  auto stamp = fs::last_write_time(out + "/train_000000.bin");
  PrepareReport again = prepare_dataset(options(), kQuiet);
  EXPECT_TRUE(again.reused);
  EXPECT_EQ(again.train_tokens, first.train_tokens);
  EXPECT_EQ(fs::last_write_time(out + "/train_000000.bin"), stamp);
  // Another shard size rebuilds the shards but reuses the tokenizer (trained on the same inputs);
  // a changed input rebuilds both.
  PrepareOptions o = options();
  o.shard_tokens = 800;
  auto tok_stamp = fs::last_write_time(out + "/tokenizer.json");
  PrepareReport resharded = prepare_dataset(o, kQuiet);
  EXPECT_FALSE(resharded.reused);
  EXPECT_GT(resharded.train_shards, first.train_shards);
  EXPECT_EQ(fs::last_write_time(out + "/tokenizer.json"), tok_stamp);
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_EQ(e.path().string().find(".pending"), std::string::npos) << "left behind: " << e.path();
  std::ofstream(in + "/alpha", std::ios::app) << "a brand new fortune\n%\n";
  PrepareReport rebuilt = prepare_dataset(o, kQuiet);
  EXPECT_FALSE(rebuilt.reused);
  EXPECT_EQ(rebuilt.train_docs + rebuilt.val_docs, docs.size() + 1);
}

// Outputs prepared under other splitting rules (an older pre-tokenizer's Unicode classes) are stale:
// they are rebuilt, tokenizer included, never reused.
TEST_F(PrepareTest, OutputsOfAnotherPretokenizerAreRebuilt) {
  prepare_dataset(options(), kQuiet);
  // Every place the two files record the pre-tokenizer now names another one.
  for (const char* f : {"/meta.json", "/tokenizer.json"}) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(out + f));
    int replaced = 0;
    std::function<void(nlohmann::json&)> swap = [&](nlohmann::json& x) {
      if (x.is_string() && x.get<std::string>() == pretokenizer_id()) x = "gpt2, hand-written tables", replaced++;
      if (x.is_structured())
        for (auto& y : x) swap(y);
    };
    swap(j);
    ASSERT_GT(replaced, 0) << f << " does not record the pre-tokenizer";
    std::ofstream(out + f) << j.dump();
  }
  auto tok_stamp = fs::last_write_time(out + "/tokenizer.json");
  const PrepareReport again = prepare_dataset(options(), kQuiet);
  EXPECT_FALSE(again.reused);
  EXPECT_NE(fs::last_write_time(out + "/tokenizer.json"), tok_stamp) << "the tokenizer was not retrained";
}

TEST_F(PrepareTest, NonUtf8AndBinaryBytesAreTokenizedNotRejected) {
  std::string bytes;
  for (int i = 0; i < 3000; i++) bytes += char(rng() % 256);
  std::ofstream(in + "/garbage.bin", std::ios::binary) << bytes;
  PrepareOptions o = options();
  o.inputs = {in + "/garbage.bin"};
  o.splitter = Splitter::file;
  o.val_fraction = 0;
  PrepareReport r = prepare_dataset(o, kQuiet);
  EXPECT_EQ(r.train_docs, 1u);
  Tokenizer tok = Tokenizer::load(out + "/tokenizer.json");
  EXPECT_EQ(decode_split(out, Split::train, tok), std::vector<std::string>{bytes});
}

TEST_F(PrepareTest, BadInputFailsNamingTheProblemAndLeavesNothingThatLooksValid) {
  auto message = [&](PrepareOptions o) -> std::string {
    try {
      prepare_dataset(o, kQuiet);
    } catch (const mt::Error& e) {
      return e.what();
    }
    return "";
  };
  PrepareOptions o = options();
  o.inputs = {};
  EXPECT_NE(message(o).find("--input"), std::string::npos);
  o.inputs = {in + "/missing"};
  EXPECT_NE(message(o).find(in + "/missing"), std::string::npos);
  std::ofstream(dir + "/empty.txt").close();
  o.inputs = {dir + "/empty.txt"};
  o.out_dir = dir + "/not_yet";
  EXPECT_NE(message(o).find("no documents"), std::string::npos);
  EXPECT_FALSE(fs::exists(o.out_dir)) << "a failed prepare left an empty --out directory";
  o = options();
  o.vocab_size = 100;
  EXPECT_NE(message(o).find("--vocab"), std::string::npos);
  o = options();
  o.val_fraction = 1.5;
  EXPECT_NE(message(o).find("--val-fraction"), std::string::npos);
  if (::geteuid() != 0) {  // root reads anything
    std::ofstream(dir + "/secret.txt") << "x";
    fs::permissions(dir + "/secret.txt", fs::perms::none);
    o = options();
    o.inputs = {dir + "/secret.txt"};
    EXPECT_NE(message(o).find("secret.txt"), std::string::npos);
  }
  // A failed re-run over a good output removes the manifest and shards instead of leaving a mix.
  prepare_dataset(options(), kQuiet);
  std::ofstream(out + "/train_000077.bin.pending") << "partial";
  std::ofstream(dir + "/empty.txt") << "   \n";
  o = options();
  o.inputs = {dir + "/empty.txt"};
  EXPECT_NE(message(o).find("no documents"), std::string::npos);
  EXPECT_FALSE(fs::exists(out + "/meta.json"));
  EXPECT_FALSE(fs::exists(out + "/train_000077.bin.pending"));
  EXPECT_THROW(Dataset(out, Split::train), mt::Error);
}

TEST_F(PrepareTest, InspectPrintsHeaderCountsAndDecodedSample) {
  prepare_dataset(options(), kQuiet);
  std::FILE* f = std::tmpfile();
  inspect_shard(out + "/train_000000.bin", "", 40, f);
  std::rewind(f);
  std::string text(1 << 16, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  EXPECT_NE(text.find("MTTOKENS version 1"), std::string::npos) << text;
  EXPECT_NE(text.find("documents"), std::string::npos);
  EXPECT_NE(text.find("<|endoftext|>"), std::string::npos) << "the sample starts with a document's EOT";
  EXPECT_NE(text.find(docs[0].substr(0, 3)), std::string::npos) << text;
  // A tokenizer with another vocabulary is a mismatch, not a garbled sample.
  Tokenizer::train(std::vector<std::string>{"zz zz zz zz"}, 400).save(dir + "/other.json");
  std::FILE* g = std::tmpfile();
  EXPECT_THROW(inspect_shard(out + "/train_000000.bin", dir + "/other.json", 10, g), mt::Error);
  std::fclose(g);
}

// The decoded sample is printed byte for byte: a NUL in the text does not end it.
TEST_F(PrepareTest, InspectPrintsTheWholeSamplePastANulByte) {
  const std::string doc = std::string("before the NUL ") + '\0' + " and after it\n";
  std::ofstream(in + "/nul.txt", std::ios::binary) << doc;
  PrepareOptions o = options();
  o.inputs = {in + "/nul.txt"};
  o.splitter = Splitter::file;
  o.val_fraction = 0;
  prepare_dataset(o, kQuiet);
  std::FILE* f = std::tmpfile();
  inspect_shard(out + "/train_000000.bin", "", 1000, f);
  std::rewind(f);
  std::string text(1 << 16, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  EXPECT_NE(text.find("<|endoftext|>" + doc), std::string::npos) << text;
}

TEST_F(PrepareTest, CliParsesFlagsAndReportsErrorsWithExitCodes) {
  auto run = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return data_cli(int(argv.size()), argv.data());
  };
  EXPECT_EQ(run({"prepare", "--input", in + "/alpha", in + "/sub/beta", "--out", out, "--splitter=fortune",
                 "--vocab", "300", "--val-fraction", "0.05", "--threads", "2"}),
            0);
  EXPECT_TRUE(fs::exists(out + "/meta.json"));
  EXPECT_EQ(run({"inspect", out + "/train_000000.bin", "--sample", "5"}), 0);
  EXPECT_EQ(run({"prepare", "--input", in, "--out", out, "--bogus", "1"}), 1);
  EXPECT_EQ(run({"prepare", "--input", in, "--out", out, "--vocab", "many"}), 1);
  EXPECT_EQ(run({"prepare", "--input", in, "--out"}), 1);
  EXPECT_EQ(run({"inspect"}), 1);
  EXPECT_EQ(run({"frobnicate"}), 2);
  std::ofstream(dir + "/notashard.bin") << "hello";
  EXPECT_EQ(run({"inspect", dir + "/notashard.bin"}), 1);
}
