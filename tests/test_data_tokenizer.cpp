// Byte-level BPE: pre-tokenization, training, encode/decode round trips, file formats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "data/pretokenize.h"
#include "data/tokenizer.h"
#include "runtime/check.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace mt::data;

namespace {

std::vector<std::string> pieces_of(std::string_view s) {
  std::vector<std::string_view> v;
  pretokenize(s, v);
  return {v.begin(), v.end()};
}

// Arbitrary bytes with a bias towards text: ASCII, multi-byte UTF-8, and invalid sequences.
std::string random_bytes(std::mt19937_64& rng, size_t n) {
  static const std::vector<std::string> frags = {
      " ", "  ", "\n", "\t", "a", "Z", "7", "'s", "'ll", ".", "!?", "é", "日本", "€", "\xff", "\xc3",
      "\xe2\x82", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf", std::string(1, '\0')};
  std::string s;
  while (s.size() < n) {
    if (rng() % 3 == 0)
      s += char(rng() % 256);
    else
      s += frags[rng() % frags.size()];
  }
  return s;
}

// A corpus of "words" over a small syllable set, so BPE has frequent pairs to learn.
std::vector<std::string> random_corpus(std::mt19937_64& rng, int docs) {
  static const char* syl[] = {"ka", "ri", "to", "men", "su", "lo", "the", "ing", "qu", "ax", "é", "ß"};
  std::vector<std::string> out;
  for (int d = 0; d < docs; d++) {
    std::string s;
    int words = 5 + int(rng() % 30);
    for (int w = 0; w < words; w++) {
      if (w) s += rng() % 9 == 0 ? "\n" : " ";
      int k = 1 + int(rng() % 3);
      for (int i = 0; i < k; i++) s += syl[rng() % std::size(syl)];
      if (rng() % 7 == 0) s += ",";
    }
    out.push_back(s);
  }
  return out;
}

class TokenizerTest : public ::testing::Test {
 protected:
  std::mt19937_64 rng{mt::testing::test_seed()};
  std::string dir = mt::testing::make_temp_dir("mt_tok");
  void TearDown() override { fs::remove_all(dir); }
};

}  // namespace

TEST(Pretokenize, PiecesPartitionAnyByteString) {
  std::mt19937_64 rng(mt::testing::test_seed());
  for (int trial = 0; trial < 200; trial++) {
    std::string s = random_bytes(rng, rng() % 300);
    std::string joined;
    for (const auto& p : pieces_of(s)) {
      EXPECT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, s);
  }
}

TEST(Pretokenize, SplitsLikeTheGpt2Pattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces_of("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces_of("I'm here, don't"), (V{"I", "'m", " here", ",", " don", "'t"}));
  EXPECT_EQ(pieces_of("  two spaces"), (V{" ", " two", " spaces"}));
  EXPECT_EQ(pieces_of("a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces_of("x = 3.14!!"), (V{"x", " =", " 3", ".", "14", "!!"}));
  EXPECT_EQ(pieces_of("hi  "), (V{"hi", "  "}));
  EXPECT_EQ(pieces_of("café ñandú"), (V{"café", " ñandú"}));
  EXPECT_EQ(pieces_of("2024年は"), (V{"2024", "年は"}));
  EXPECT_EQ(pieces_of("'hello' 'S"), (V{"'", "hello", "'", " '", "S"}));
  EXPECT_EQ(pieces_of(" \n word"), (V{" \n", " word"}));
}

TEST(Pretokenize, InvalidUtf8BytesAreSingleOtherCharacters) {
  uint32_t cp;
  const unsigned char overlong[] = {0xC0, 0xAF};
  EXPECT_EQ(utf8_next(overlong, 2, cp), 1);
  EXPECT_EQ(char_class(cp), CharClass::other);
  const unsigned char euro[] = {0xE2, 0x82, 0xAC};
  EXPECT_EQ(utf8_next(euro, 3, cp), 3);
  EXPECT_EQ(cp, 0x20ACu);
  EXPECT_EQ(utf8_next(euro, 2, cp), 1) << "a truncated sequence is invalid";
}

TEST_F(TokenizerTest, RoundTripsArbitraryBytesIncludingInvalidUtf8) {
  Tokenizer tok = Tokenizer::train(random_corpus(rng, 300), 400);
  for (int trial = 0; trial < 100; trial++) {
    std::string s = random_bytes(rng, rng() % 500);
    std::vector<int32_t> ids = tok.encode(s);
    for (int32_t id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, tok.vocab_size());
      ASSERT_NE(id, tok.eot_token()) << "text never encodes to end-of-text";
    }
    ASSERT_EQ(tok.decode(ids), s);
  }
}

TEST_F(TokenizerTest, TrainingReachesTheVocabAndCompressesItsCorpus) {
  auto corpus = random_corpus(rng, 400);
  Tokenizer tok = Tokenizer::train(corpus, 500);
  EXPECT_EQ(tok.vocab_size(), 500);
  EXPECT_EQ(tok.eot_token(), 499);
  EXPECT_EQ(tok.num_merges(), 500u - 257u);
  size_t bytes = 0, tokens = 0;
  for (const auto& d : corpus) {
    auto ids = tok.encode(d);
    ASSERT_EQ(tok.decode(ids), d);
    bytes += d.size();
    tokens += ids.size();
  }
  EXPECT_LT(double(tokens), 0.4 * double(bytes)) << "learned merges should at least halve a repetitive corpus";
  // Deterministic: the same corpus gives the same merges.
  EXPECT_EQ(Tokenizer::train(corpus, 500).fingerprint(), tok.fingerprint());
}

TEST_F(TokenizerTest, StopsEarlyWhenNoPairRepeats) {
  std::vector<std::string> corpus = {"ab"};
  Tokenizer tok = Tokenizer::train(corpus, 1000);
  EXPECT_EQ(tok.num_merges(), 0u);
  EXPECT_EQ(tok.vocab_size(), 257);
  EXPECT_THROW(Tokenizer::train(corpus, 100), mt::Error);
}

TEST_F(TokenizerTest, HeapMergeLoopMatchesTheSimpleLoop) {
  Tokenizer tok = Tokenizer::train(random_corpus(rng, 300), 450);
  static const char* syl[] = {"ka", "ri", "to", "men", "the", "ing", "a", "k"};
  for (int trial = 0; trial < 50; trial++) {
    std::string word;
    size_t len = 1 + rng() % 1500;
    while (word.size() < len) word += syl[rng() % std::size(syl)];
    std::vector<int32_t> a, b;
    tok.encode_piece(word, a, false);
    tok.encode_piece(word, b, true);
    ASSERT_EQ(a, b) << word;
    ASSERT_EQ(tok.decode(a), word);
  }
}

TEST_F(TokenizerTest, SaveLoadKeepsEncodingsAndEot) {
  Tokenizer tok = Tokenizer::train(random_corpus(rng, 200), 380);
  std::string p = dir + "/tokenizer.json";
  tok.save(p, {{"note", "test"}});
  Tokenizer back = Tokenizer::load(p);
  EXPECT_EQ(back.fingerprint(), tok.fingerprint());
  EXPECT_EQ(Tokenizer::load_any(dir).fingerprint(), tok.fingerprint());
  std::string s = random_bytes(rng, 400);
  EXPECT_EQ(back.encode(s), tok.encode(s));
  std::vector<int32_t> with_eot = {tok.eot_token()};
  EXPECT_EQ(tok.decode(with_eot), "<|endoftext|>");
  EXPECT_THROW(tok.decode(std::vector<int32_t>{tok.vocab_size()}), mt::Error);
}

TEST_F(TokenizerTest, BrokenTokenizerFilesAreRejectedNamingTheFile) {
  auto expect_error = [&](const std::string& text, const char* what) {
    std::string p = dir + "/bad.json";
    std::ofstream(p) << text;
    try {
      Tokenizer::load(p);
      ADD_FAILURE() << what << ": loaded";
    } catch (const mt::Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  expect_error("{not json", "invalid JSON");
  expect_error(R"({"format":"other"})", "wrong format");
  nlohmann::json j = {{"format", "minitrain-bpe"}, {"version", 1}, {"vocab_size", 258}, {"eot_token", 257}};
  std::vector<int> bytes(256);
  for (int i = 0; i < 256; i++) bytes[size_t(i)] = i;
  j["byte_ids"] = bytes;
  j["merges"] = nlohmann::json::array({nlohmann::json::array({1, 300, 256})});
  expect_error(j.dump(), "merge of an undefined token");
  j["merges"] = nlohmann::json::array();
  expect_error(j.dump(), "vocab size disagrees with the merges");
}

// GPT-2's byte -> code point map, restated here from its definition (printable Latin-1 kept,
// the rest shifted to U+0100.. in order) so the loader is checked against an independent copy.
static std::string gpt2_token(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) {
    uint32_t cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
      uint32_t k = 0;
      for (uint32_t x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) k++;
      cp = 256 + k;
    }
    if (cp < 0x80) {
      s += char(cp);
    } else {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    }
  }
  return s;
}

TEST_F(TokenizerTest, LoadsGpt2VocabAndMerges) {
  // A miniature GPT-2 tokenizer: the 256 byte tokens in a shuffled order, three merges, EOT last.
  std::vector<int> order(256);
  for (int i = 0; i < 256; i++) order[size_t(i)] = i;
  std::shuffle(order.begin(), order.end(), rng);
  nlohmann::json vocab;
  for (int b = 0; b < 256; b++) vocab[gpt2_token(std::string(1, char(b)))] = order[size_t(b)];
  vocab[gpt2_token("he")] = 256;
  vocab[gpt2_token(" t")] = 257;
  vocab[gpt2_token(" the")] = 258;
  vocab["<|endoftext|>"] = 259;
  std::ofstream(dir + "/vocab.json") << vocab.dump();
  std::ofstream(dir + "/merges.txt") << "#version: 0.2\n"
                                     << gpt2_token("h") << " " << gpt2_token("e") << "\n"
                                     << gpt2_token(" ") << " " << gpt2_token("t") << "\n"
                                     << gpt2_token(" t") << " " << gpt2_token("he") << "\n";
  Tokenizer tok = Tokenizer::load_any(dir);
  EXPECT_EQ(tok.vocab_size(), 260);
  EXPECT_EQ(tok.eot_token(), 259);
  EXPECT_EQ(tok.encode(" the"), (std::vector<int32_t>{258}));
  EXPECT_EQ(tok.encode("he\n"), (std::vector<int32_t>{256, order['\n']}));
  std::string s = random_bytes(rng, 200);
  EXPECT_EQ(tok.decode(tok.encode(s)), s);
  // Our own format keeps GPT-2's numbering.
  tok.save(dir + "/ours.json");
  EXPECT_EQ(Tokenizer::load(dir + "/ours.json").encode(" the he"), tok.encode(" the he"));
}
