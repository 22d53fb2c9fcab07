// Whole-model properties of the attention paths and of 16-bit storage:
//  - the flash path (online softmax, no T x T buffer) gives the materialised path's loss and
//    gradients up to fp32 summation order, with and without packed-document masks;
//  - with flash, none | selective | full recompute give bitwise identical gradients, and its
//    activation peak is below the materialised one;
//  - bf16/fp16 storage halves the activation memory and stays close to the fp32 gradients.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "model/gpt.h"
#include "tests/test_util.h"

namespace mt::model {
namespace {

struct RunResult {
  double loss = 0;
  std::vector<float> grads;
  size_t activation_peak = 0;
};

struct Batch {
  int B = 2, T = 32;
  std::vector<int32_t> tokens, targets, docs;
};

GPTConfig test_config() {
  GPTConfig cfg;
  cfg.vocab_size = 211;
  cfg.block_size = 48;
  cfg.n_layer = 4;
  cfg.n_head = 4;
  cfg.n_embd = 48;
  return cfg;
}

Batch random_batch(const GPTConfig& cfg, int B, int T, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, cfg.vocab_size - 1);
  Batch b;
  b.B = B;
  b.T = T;
  for (int i = 0; i < B * T; i++) {
    b.tokens.push_back(d(rng));
    b.targets.push_back(d(rng));
    const int t = i % T;  // three packed documents per row
    b.docs.push_back(t < T / 3 ? 0 : t < 2 * T / 3 ? 1 : 2);
  }
  return b;
}

RunResult run_once(const GPTConfig& cfg, Attention att, Recompute r, DType precision, const Batch& b, bool docs) {
  Arena arena;
  ParamStore store;
  GPT gpt(cfg, store);
  store.finalize(arena, precision);
  gpt.init_weights(7);
  gpt.set_arena(&arena);
  gpt.set_recompute(r);
  gpt.set_attention(att);
  store.zero_grads();
  arena.reset_peaks();
  MicroBatch mb{b.B, b.T, b.tokens.data(), b.targets.data(), nullptr, docs ? b.docs.data() : nullptr};
  RunResult res;
  res.loss = gpt.forward_backward(mb, 1.f / float(b.B * b.T));
  res.grads.assign(store.grads(), store.grads() + store.total_numel());
  res.activation_peak = arena.stats().peak[size_t(MemCategory::activations)];
  EXPECT_EQ(arena.stats().live[size_t(MemCategory::activations)], 0u) << "activations leaked after backward";
  return res;
}

// Gradient error relative to the largest gradient of the reference.
double grad_error(const RunResult& a, const RunResult& ref) {
  return testing::max_rel_error(a.grads.data(), ref.grads.data(), ref.grads.size());
}

class FlashVsMaterialized : public ::testing::TestWithParam<bool> {};

TEST_P(FlashVsMaterialized, SameLossAndGradientsInFp32) {
  const GPTConfig cfg = test_config();
  const Batch b = random_batch(cfg, 3, 37, testing::test_seed());  // T not a multiple of any tile
  const bool docs = GetParam();
  const RunResult mat = run_once(cfg, Attention::materialized, Recompute::none, DType::f32, b, docs);
  const RunResult fl = run_once(cfg, Attention::flash, Recompute::none, DType::f32, b, docs);
  EXPECT_NEAR(fl.loss, mat.loss, 1e-5 * std::abs(mat.loss));
  const double err = grad_error(fl, mat);
  std::printf("flash vs materialized (docs=%d): loss %.8f vs %.8f, grad max rel err %.3g\n", int(docs), fl.loss,
              mat.loss, err);
  EXPECT_LT(err, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(DocMask, FlashVsMaterialized, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "documents" : "causal"; });

TEST(FlashAttention, RecomputeModesAreBitwiseIdenticalAndUseLessMemory) {
  const GPTConfig cfg = test_config();
  const Batch b = random_batch(cfg, 2, 48, testing::test_seed() + 1);
  const RunResult none = run_once(cfg, Attention::flash, Recompute::none, DType::f32, b, true);
  const RunResult sel = run_once(cfg, Attention::flash, Recompute::selective, DType::f32, b, true);
  const RunResult full = run_once(cfg, Attention::flash, Recompute::full, DType::f32, b, true);
  EXPECT_EQ(none.loss, sel.loss);
  EXPECT_EQ(none.loss, full.loss);
  EXPECT_EQ(0, std::memcmp(none.grads.data(), sel.grads.data(), none.grads.size() * 4));
  EXPECT_EQ(0, std::memcmp(none.grads.data(), full.grads.data(), none.grads.size() * 4));
  const RunResult mat = run_once(cfg, Attention::materialized, Recompute::none, DType::f32, b, true);
  std::printf("activation peak: materialized %zu, flash %zu, flash+full %zu bytes\n", mat.activation_peak,
              none.activation_peak, full.activation_peak);
  EXPECT_LT(none.activation_peak, mat.activation_peak);
  EXPECT_LT(full.activation_peak, none.activation_peak);
}

class LowPrecisionStorage : public ::testing::TestWithParam<DType> {};

TEST_P(LowPrecisionStorage, HalvesActivationsAndTracksFp32) {
  const GPTConfig cfg = test_config();
  const Batch b = random_batch(cfg, 2, 32, testing::test_seed() + 2);
  for (Attention att : {Attention::materialized, Attention::flash}) {
    const RunResult f32 = run_once(cfg, att, Recompute::none, DType::f32, b, true);
    const RunResult low = run_once(cfg, att, Recompute::none, GetParam(), b, true);
    const double ratio = double(low.activation_peak) / double(f32.activation_peak);
    const double err = grad_error(low, f32);
    std::printf("%s %s: activation peak %zu vs fp32 %zu (%.3f), loss %.6f vs %.6f, grad max rel err %.3g\n",
                dtype_name(GetParam()), attention_name(att), low.activation_peak, f32.activation_peak, ratio,
                low.loss, f32.loss, err);
    // Everything but the fp32 LayerNorm statistics, losses and log-sum-exp is stored in 16 bits.
    EXPECT_GT(ratio, 0.45);
    EXPECT_LT(ratio, 0.56);
    // A few roundings per layer at the unit roundoff (2^-8 bf16, 2^-11 fp16), through 4 layers.
    const double unit = GetParam() == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
    EXPECT_NEAR(low.loss, f32.loss, 4 * unit * std::abs(f32.loss));
    EXPECT_LT(err, 16 * unit);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, LowPrecisionStorage, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace mt::model
