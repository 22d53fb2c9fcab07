// safetensors I/O: what is written reads back byte for byte, files laid out by other writers read,
// every malformed file is refused with an error naming the file, and the committed GPT-2 fixtures
// are well-formed and self-consistent.
#include "runtime/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "runtime/check.h"
#include "tests/test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir("mt_safetensors"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // Writes raw bytes: an 8-byte length (the header's size unless overridden), the header, the data.
  std::string craft(const std::string& name, const std::string& header, const std::string& data,
                    int64_t length_field = -1) const {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    uint64_t n = length_field < 0 ? header.size() : uint64_t(length_field);
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << data;
    return p;
  }

  std::string dir_;
};

// Expects reading `p` to fail with a message that names the file and contains `what`.
void expect_read_fails(const std::string& p, const std::string& what) {
  try {
    SafetensorsFile::read(p);
    ADD_FAILURE() << "reading " << p << " succeeded; expected an error containing '" << what << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(p), std::string::npos) << "error does not name the file: " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << "error does not say '" << what << "': " << msg;
  }
}

std::vector<uint8_t> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

TEST_F(Safetensors, RoundTripPreservesNamesDtypesShapesAndBytes) {
  std::mt19937_64 rng(testing::test_seed());
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::u16};
  std::vector<SafeTensor> expect;
  // A scalar and an empty tensor always, then random ranks 1-4 with odd sizes.
  std::vector<std::vector<int64_t>> shapes = {{}, {3, 0, 5}};
  for (int i = 0; i < 8; i++) {
    std::vector<int64_t> s(1 + rng() % 4);
    for (auto& d : s) d = 1 + int64_t(rng() % 7);
    shapes.push_back(s);
  }
  SafetensorsWriter w;
  for (size_t i = 0; i < shapes.size(); i++) {
    SafeTensor t;
    t.name = "layer." + std::to_string(i) + (i % 2 ? ".weight" : ".bias");
    t.dtype = dtypes[rng() % 5];
    t.shape = shapes[i];
    t.data = random_bytes(size_t(t.numel()) * dtype_size(t.dtype), rng);
    w.add(t.name, t.dtype, t.shape, t.data.data());
    expect.push_back(t);
  }
  w.write(path("rt.safetensors"));
  SafetensorsFile f = SafetensorsFile::read(path("rt.safetensors"));
  ASSERT_EQ(f.tensors().size(), expect.size());
  for (size_t i = 0; i < expect.size(); i++) {
    const SafeTensor& got = f.tensors()[i];  // tensors come back in the order they were added
    EXPECT_EQ(got.name, expect[i].name);
    EXPECT_EQ(got.dtype, expect[i].dtype) << got.name;
    EXPECT_EQ(got.shape, expect[i].shape) << got.name;
    EXPECT_EQ(got.data, expect[i].data) << got.name;
    EXPECT_EQ(f.find(got.name), &got);
  }
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.find("absent"), nullptr);
}

TEST_F(Safetensors, F32ValuesStoredAsBf16OrF16ReadBackRoundedToNearestEven) {
  std::mt19937_64 rng(testing::test_seed() + 1);
  std::vector<float> x = testing::random_floats(257, rng, -300.f, 300.f);
  x[0] = 0.f;
  x[1] = 1e-6f;  // an fp16 subnormal
  SafetensorsWriter w;
  w.add_f32("f32", {257}, x.data());
  w.add_f32("bf16", {257}, x.data(), DType::bf16);
  w.add_f32("f16", {257}, x.data(), DType::f16);
  w.write(path("lp.safetensors"));
  SafetensorsFile f = SafetensorsFile::read(path("lp.safetensors"));
  EXPECT_EQ(f.get("bf16").dtype, DType::bf16);
  EXPECT_EQ(f.get("f16").dtype, DType::f16);
  std::vector<float> a = f.to_f32("f32"), b = f.to_f32("bf16"), h = f.to_f32("f16");
  for (size_t i = 0; i < x.size(); i++) {
    ASSERT_EQ(a[i], x[i]) << i;  // exact
    ASSERT_EQ(b[i], round_bf16(x[i])) << i;
    ASSERT_EQ(h[i], round_f16(x[i])) << i;
  }
}

TEST_F(Safetensors, MetadataRoundTripsIncludingJsonSpecialCharacters) {
  std::mt19937_64 rng(testing::test_seed() + 2);
  SafetensorsWriter w;
  std::map<std::string, std::string> meta = {
      {"config", R"({"n_layer": 2, "name": "gpt \"tiny\""})"}, {"note", "line 1\nline 2\t\\ end"},
      {"step", std::to_string(rng() % 1000000)}};
  for (const auto& [k, v] : meta) w.set_metadata(k, v);
  int32_t ids[3] = {int32_t(rng() % 50257), -1, 7};
  w.add_i32("ids", {3}, ids);
  w.write(path("meta.safetensors"));
  SafetensorsFile f = SafetensorsFile::read(path("meta.safetensors"));
  EXPECT_EQ(f.metadata(), meta);
  EXPECT_EQ(f.to_i32("ids"), std::vector<int32_t>(ids, ids + 3));
}

TEST_F(Safetensors, DataBufferStartsOnAnEightByteBoundary) {
  SafetensorsWriter w;
  float x = 1.f;
  for (int n = 1; n <= 9; n++) w.add_f32(std::string(size_t(n), 'x'), {1}, &x);  // varied header lengths
  w.write(path("align.safetensors"));
  std::ifstream f(path("align.safetensors"), std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST_F(Safetensors, WriteReplacesAnExistingFileWholeAndLeavesNoTemporary) {
  std::mt19937_64 rng(testing::test_seed() + 3);
  std::vector<float> big = testing::random_floats(10000, rng), small = testing::random_floats(3, rng);
  SafetensorsWriter w1, w2;
  w1.add_f32("w", {100, 100}, big.data());
  w2.add_f32("w", {3}, small.data());
  w1.write(path("ckpt.safetensors"));
  w2.write(path("ckpt.safetensors"));
  SafetensorsFile f = SafetensorsFile::read(path("ckpt.safetensors"));
  EXPECT_EQ(f.to_f32("w"), small);
  EXPECT_FALSE(fs::exists(path("ckpt.safetensors.tmp")));
}

TEST_F(Safetensors, WriteIntoAMissingDirectoryFailsNamingThePath) {
  SafetensorsWriter w;
  float x = 0.f;
  w.add_f32("x", {1}, &x);
  std::string p = path("no_such_dir/out.safetensors");
  try {
    w.write(p);
    ADD_FAILURE() << "write into a missing directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(Safetensors, WriterRejectsDuplicateAndReservedNames) {
  SafetensorsWriter w;
  float x = 0.f;
  w.add_f32("x", {1}, &x);
  EXPECT_THROW(w.add_f32("x", {1}, &x), Error);
  EXPECT_THROW(w.add_f32("__metadata__", {1}, &x), Error);
  EXPECT_THROW(w.add_f32("", {1}, &x), Error);
  EXPECT_THROW(w.add_f32("neg", {-1}, &x), Error);
}

TEST_F(Safetensors, LookupsOfAbsentOrMistypedTensorsFailNamingFileAndTensor) {
  SafetensorsWriter w;
  float x[2] = {1.f, 2.f};
  int32_t i[2] = {3, 4};
  w.add_f32("weights", {2}, x);
  w.add_i32("tokens", {2}, i);
  w.write(path("look.safetensors"));
  SafetensorsFile f = SafetensorsFile::read(path("look.safetensors"));
  for (auto op : {+[](const SafetensorsFile& g) { g.get("missing"); },
                  +[](const SafetensorsFile& g) { g.to_f32("tokens"); },
                  +[](const SafetensorsFile& g) { g.to_i32("weights"); }}) {
    try {
      op(f);
      ADD_FAILURE() << "lookup succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(f.path()), std::string::npos) << e.what();
    }
  }
}

// Bytes laid out by hand the way Python's writers lay them out: header padded with spaces, a
// "format" metadata entry, I64 token ids, tensors ordered by element size, a scalar.
TEST_F(Safetensors, FileLaidOutByPythonWritersReadsBack) {
  std::string header =
      R"({"__metadata__":{"format":"pt"},"ids":{"dtype":"I64","shape":[2,2],"data_offsets":[0,32]},)"
      R"("s":{"dtype":"F32","shape":[],"data_offsets":[32,36]},)"
      R"("h":{"dtype":"F16","shape":[1,2],"data_offsets":[36,40]},)"
      R"("w":{"dtype":"BF16","shape":[3],"data_offsets":[40,46]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const int64_t ids[4] = {1, -2, 50256, 7};
  const float s = 3.25f;
  const uint16_t h[2] = {0x3c00, 0xb800};          // f16 1.0, -0.5
  const uint16_t bf[3] = {0x3f80, 0xc000, 0x3f00};  // bf16 1.0, -2.0, 0.5
  std::string data(46, '\0');
  std::memcpy(&data[0], ids, 32);
  std::memcpy(&data[32], &s, 4);
  std::memcpy(&data[36], h, 4);
  std::memcpy(&data[40], bf, 6);
  SafetensorsFile f = SafetensorsFile::read(craft("py.safetensors", header, data));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.get("ids").dtype, DType::i32);  // narrowed
  EXPECT_EQ(f.get("ids").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(f.to_i32("ids"), (std::vector<int32_t>{1, -2, 50256, 7}));
  EXPECT_TRUE(f.get("s").shape.empty());
  EXPECT_EQ(f.to_f32("s"), std::vector<float>{3.25f});
  EXPECT_EQ(f.to_f32("h"), (std::vector<float>{1.0f, -0.5f}));
  EXPECT_EQ(f.to_f32("w"), (std::vector<float>{1.0f, -2.0f, 0.5f}));
}

TEST_F(Safetensors, EveryMalformedFileIsRefusedWithItsNameAndTheProblem) {
  const std::string f8(8, '\1'), f12(12, '\1');
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  expect_read_fails(path("absent.safetensors"), "no such file");
  {
    std::string p = path("short.safetensors");
    std::ofstream(p, std::ios::binary) << "abcde";
    expect_read_fails(p, "truncated");
  }
  expect_read_fails(craft("len.safetensors", "{" + ok_a + "}", f8, 4096), "exceeds");
  expect_read_fails(craft("json.safetensors", R"({"a": {"dtype": )", ""), "malformed JSON");
  expect_read_fails(craft("array.safetensors", "[1, 2]", ""), "not a JSON object");
  expect_read_fails(craft("dtype.safetensors", R"({"a":{"dtype":"F8_E5M2","shape":[8],"data_offsets":[0,8]}})", f8),
                    "unsupported dtype 'F8_E5M2'");
  expect_read_fails(craft("size.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f8),
                    "need 12");
  expect_read_fails(craft("range.safetensors", "{" + ok_a + "}", std::string(4, '\0')), "out of range");
  expect_read_fails(craft("overlap.safetensors",
                          "{" + ok_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", f12),
                    "overlap");
  expect_read_fails(craft("hole.safetensors",
                          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                          f12),
                    "belong to no tensor");
  expect_read_fails(craft("tail.safetensors", "{" + ok_a + "}", f12), "cover only 8");
  expect_read_fails(craft("reversed.safetensors", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", f8),
                    "end before");
  expect_read_fails(craft("neg.safetensors", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f8),
                    "non-negative");
  expect_read_fails(craft("field.safetensors", R"({"a":{"dtype":"F32","shape":[2]}})", f8), "data_offsets");
  expect_read_fails(craft("meta.safetensors", "{" + ok_a + R"(,"__metadata__":{"step":3}})", f8), "not a string");
  expect_read_fails(craft("dup.safetensors", "{" + ok_a + "," + ok_a + "}", f8), "more than once");
  const int64_t too_big = int64_t(1) << 40;
  expect_read_fails(craft("i64.safetensors", R"({"t":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                          std::string(reinterpret_cast<const char*>(&too_big), 8)),
                    "does not fit in int32");
}

// The fixtures from scripts/gen_fixtures.py: every weight has a gradient of its shape, the stored
// loss is the mean cross-entropy of the stored logits over non-ignored targets, and packed rows'
// positions restart at each document.
void check_gpt2_fixture(const std::string& file, bool docmask) {
  SafetensorsFile f = SafetensorsFile::read(std::string(MT_SOURCE_DIR) + "/tests/fixtures/" + file);
  ASSERT_TRUE(f.metadata().count("config"));
  const int V = 97, C = 32, L = 2, B = 2, T = 12;
  EXPECT_NE(f.metadata().at("config").find("\"vocab_size\": 97"), std::string::npos);
  std::vector<std::pair<std::string, std::vector<int64_t>>> weights = {
      {"transformer.wte.weight", {V, C}}, {"transformer.wpe.weight", {16, C}},
      {"transformer.ln_f.weight", {C}}, {"transformer.ln_f.bias", {C}}};
  for (int l = 0; l < L; l++) {
    std::string h = "transformer.h." + std::to_string(l) + ".";
    for (const char* ln : {"ln_1.", "ln_2."}) {
      weights.push_back({h + ln + "weight", {C}});
      weights.push_back({h + ln + "bias", {C}});
    }
    weights.push_back({h + "attn.c_attn.weight", {C, 3 * C}});
    weights.push_back({h + "attn.c_attn.bias", {3 * C}});
    weights.push_back({h + "attn.c_proj.weight", {C, C}});
    weights.push_back({h + "attn.c_proj.bias", {C}});
    weights.push_back({h + "mlp.c_fc.weight", {C, 4 * C}});
    weights.push_back({h + "mlp.c_fc.bias", {4 * C}});
    weights.push_back({h + "mlp.c_proj.weight", {4 * C, C}});
    weights.push_back({h + "mlp.c_proj.bias", {C}});
  }
  for (const auto& [name, shape] : weights) {
    EXPECT_EQ(f.get(name).shape, shape) << name;
    EXPECT_EQ(f.get("grad." + name).shape, shape) << name;
  }
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);  // tied to wte
  EXPECT_EQ(f.get("logits").shape, (std::vector<int64_t>{B, T, V}));
  std::vector<int32_t> targets = f.to_i32("targets"), inputs = f.to_i32("inputs");
  std::vector<float> logits = f.to_f32("logits");
  double sum = 0;
  int counted = 0;
  for (int i = 0; i < B * T; i++) {
    EXPECT_TRUE(inputs[size_t(i)] >= 0 && inputs[size_t(i)] < V);
    if (targets[size_t(i)] < 0) continue;
    const float* row = &logits[size_t(i) * V];
    double mx = row[0], z = 0;
    for (int v = 0; v < V; v++) mx = std::max(mx, double(row[v]));
    for (int v = 0; v < V; v++) z += std::exp(double(row[v]) - mx);
    sum += mx + std::log(z) - row[targets[size_t(i)]];
    counted++;
  }
  EXPECT_GE(B * T - counted, 1) << "some targets must be ignored (-1)";
  const double loss = f.to_f32("loss").at(0);
  EXPECT_NEAR(sum / counted, loss, 1e-5 * loss);  // fp32 logits vs fp64 reference loss
  if (docmask) {
    std::vector<int32_t> doc = f.to_i32("doc_ids"), pos = f.to_i32("positions");
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        size_t i = size_t(b * T + t);
        bool starts = t == 0 || doc[i] != doc[i - 1];
        EXPECT_EQ(pos[i], starts ? 0 : pos[i - 1] + 1) << "row " << b << " t " << t;
      }
    }
  }
}

TEST(Gpt2Fixtures, PlainFixtureIsCompleteAndItsLossMatchesItsLogits) {
  check_gpt2_fixture("gpt2_tiny.safetensors", false);
}

TEST(Gpt2Fixtures, DocMaskedFixtureIsCompleteAndPositionsRestartPerDocument) {
  check_gpt2_fixture("gpt2_tiny_docmask.safetensors", true);
}

}  // namespace
}  // namespace mt
