// Whole-model loss and every parameter gradient against fixtures written by an independent float64
// PyTorch implementation (scripts/gen_fixtures.py). Bound: max relative error <= 1e-4 in fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "model/hf_io.h"
#include "runtime/safetensors.h"
#include "tests/test_util.h"

namespace mt::model {
namespace {

const std::string kFixtures = std::string(MT_SOURCE_DIR) + "/tests/fixtures/";

GPTConfig fixture_config(const SafetensorsFile& f) {
  auto j = nlohmann::json::parse(f.metadata().at("config"));
  GPTConfig c;
  c.vocab_size = j["vocab_size"];
  c.block_size = j["block_size"];
  c.n_layer = j["n_layer"];
  c.n_head = j["n_head"];
  c.n_embd = j["n_embd"];
  return c;
}

void check_fixture(const std::string& file, Recompute recompute, Attention attention = Attention::materialized) {
  const SafetensorsFile f = SafetensorsFile::read(kFixtures + file);
  const GPTConfig cfg = fixture_config(f);
  Arena arena;
  ParamStore store;
  GPT gpt(cfg, store);
  store.finalize(arena, DType::f32);
  import_hf(gpt, store, kFixtures + file);
  gpt.set_arena(&arena);
  gpt.set_recompute(recompute);
  gpt.set_attention(attention);

  const auto inputs = f.to_i32("inputs"), targets = f.to_i32("targets");
  std::vector<int32_t> docs, pos;
  MicroBatch mb;
  mb.B = int(f.get("inputs").shape[0]);
  mb.T = int(f.get("inputs").shape[1]);
  mb.tokens = inputs.data();
  mb.targets = targets.data();
  if (f.find("doc_ids")) {
    docs = f.to_i32("doc_ids");
    pos = f.to_i32("positions");
    mb.doc_ids = docs.data();
    mb.positions = pos.data();
  }
  int valid = 0;
  for (int32_t t : targets) valid += t >= 0;
  ASSERT_GT(valid, 0);

  store.zero_grads();
  const double loss = gpt.forward_backward(mb, 1.f / float(valid)) / valid;
  const float want_loss = f.to_f32("loss")[0];
  EXPECT_NEAR(loss, want_loss, 1e-4 * std::fabs(want_loss)) << file;

  // Every gradient, compared in the file's (HF) orientation.
  double worst = 0;
  std::string worst_name;
  for (int i = 0; i < int(store.entries().size()); i++) {
    const ParamEntry& e = store.entry(i);
    const std::vector<float> want = f.to_f32("grad." + e.name);
    std::vector<float> got(want.size());
    const float* g = store.grad(i);
    if (hf_is_conv1d(e.name)) {
      const int64_t out = e.shape[0], in = e.shape[1];  // ours (out, in), file (in, out)
      for (int64_t r = 0; r < out; r++)
        for (int64_t c = 0; c < in; c++) got[size_t(c * out + r)] = g[r * in + c];
    } else {
      std::copy(g, g + want.size(), got.begin());  // wte: the first V rows (padding excluded)
    }
    const double err = testing::max_rel_error(got.data(), want.data(), want.size(), 1e-6);
    if (err > worst) {
      worst = err;
      worst_name = e.name;
    }
  }
  std::printf("%s recompute=%s: loss %.7f vs %.7f, max relative grad error %.2e (%s)\n", file.c_str(),
              recompute_name(recompute), loss, want_loss, worst, worst_name.c_str());
  EXPECT_LE(worst, 1e-4) << "worst gradient: " << worst_name;
  // The padded vocabulary rows get no gradient.
  const ParamEntry& wte = store.entry(gpt.wte());
  for (int64_t k = int64_t(cfg.vocab_size) * cfg.n_embd; k < wte.numel; k++) ASSERT_EQ(store.grad(gpt.wte())[k], 0.f);
}

TEST(ModelFixture, LossAndAllGradientsMatchPyTorch) { check_fixture("gpt2_tiny.safetensors", Recompute::none); }

TEST(ModelFixture, DocumentMaskedLossAndGradientsMatchPyTorch) {
  check_fixture("gpt2_tiny_docmask.safetensors", Recompute::none);
}

TEST(ModelFixture, RecomputeModesGiveTheSameGradients) {
  for (Recompute r : {Recompute::selective, Recompute::full}) {
    check_fixture("gpt2_tiny.safetensors", r);
    check_fixture("gpt2_tiny_docmask.safetensors", r);
  }
}

TEST(ModelFixture, FlashAttentionMatchesPyTorch) {
  check_fixture("gpt2_tiny.safetensors", Recompute::none, Attention::flash);
  check_fixture("gpt2_tiny_docmask.safetensors", Recompute::full, Attention::flash);
}

TEST(ModelFixture, ForwardLossEqualsTrainingLoss) {
  const SafetensorsFile f = SafetensorsFile::read(kFixtures + "gpt2_tiny.safetensors");
  const GPTConfig cfg = fixture_config(f);
  Arena arena;
  ParamStore store;
  GPT gpt(cfg, store);
  store.finalize(arena, DType::f32);
  import_hf(gpt, store, kFixtures + "gpt2_tiny.safetensors");
  gpt.set_arena(&arena);
  const auto inputs = f.to_i32("inputs"), targets = f.to_i32("targets");
  MicroBatch mb{int(f.get("inputs").shape[0]), int(f.get("inputs").shape[1]), inputs.data(), targets.data(),
                nullptr, nullptr};
  EXPECT_EQ(gpt.forward_loss(mb), gpt.forward_backward(mb, 0.f));
}

}  // namespace
}  // namespace mt::model

namespace mt::model {
namespace {

// Export writes what import reads: the HF file written from a model loads back bit for bit, and its
// tensors have HF's names, (in, out) orientation and unpadded vocabulary.
TEST(HfInterop, ExportThenImportIsBitwiseAndUsesHfLayout) {
  GPTConfig cfg = GPTConfig::preset("tiny");
  cfg.vocab_size = 97;
  cfg.n_layer = 2;
  Arena arena;
  ParamStore a, b;
  GPT ga(cfg, a), gb(cfg, b);
  a.finalize(arena, DType::f32);
  b.finalize(arena, DType::f32);
  ga.init_weights(testing::test_seed());
  const std::string dir = testing::make_temp_dir("mt_hf");
  export_hf(ga, a, a.master(), dir + "/model.safetensors");
  import_hf(gb, b, dir + "/model.safetensors");
  EXPECT_EQ(0, std::memcmp(a.master(), b.master(), size_t(a.total_numel()) * 4));
  const SafetensorsFile f = SafetensorsFile::read(dir + "/model.safetensors");
  EXPECT_EQ(f.get("transformer.wte.weight").shape, (std::vector<int64_t>{97, cfg.n_embd}));
  EXPECT_EQ(f.get("transformer.h.1.attn.c_attn.weight").shape, (std::vector<int64_t>{cfg.n_embd, 3 * cfg.n_embd}));
  EXPECT_EQ(f.get("transformer.h.0.mlp.c_proj.weight").shape, (std::vector<int64_t>{4 * cfg.n_embd, cfg.n_embd}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mt::model
