// Activation checkpointing changes memory, never results: gradients are bitwise identical across
// none | selective | full, with and without packed-document masks, and the measured activation peak
// drops (full <= 1/3 of none for 12 layers).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "model/gpt.h"
#include "tests/test_util.h"

namespace mt::model {
namespace {

struct RunResult {
  double loss;
  std::vector<float> grads;
  size_t activation_peak;
};

RunResult run_once(const GPTConfig& cfg, Recompute r, DType precision, const std::vector<int32_t>& tokens,
                   const std::vector<int32_t>& targets, int B, int T, const int32_t* doc_ids = nullptr) {
  Arena arena;
  ParamStore store;
  GPT gpt(cfg, store);
  store.finalize(arena, precision);
  gpt.init_weights(42);
  gpt.set_arena(&arena);
  gpt.set_recompute(r);
  store.zero_grads();
  arena.reset_peaks();
  MicroBatch mb{B, T, tokens.data(), targets.data(), nullptr, doc_ids};
  RunResult res;
  res.loss = gpt.forward_backward(mb, 1.f / float(B * T));
  res.grads.assign(store.grads(), store.grads() + store.total_numel());
  res.activation_peak = arena.stats().peak[size_t(MemCategory::activations)];
  EXPECT_EQ(arena.stats().live[size_t(MemCategory::activations)], 0u) << "activations leaked after backward";
  return res;
}

class Recomputation : public ::testing::TestWithParam<DType> {};

// A small model of `layers` layers and one random micro-batch of tokens and targets.
struct Case {
  explicit Case(int layers) : rng(testing::test_seed()) {
    cfg.vocab_size = 211;
    cfg.block_size = 32;
    cfg.n_layer = layers;
    cfg.n_head = 4;
    cfg.n_embd = 48;
    std::uniform_int_distribution<int32_t> d(0, cfg.vocab_size - 1);
    tokens.resize(size_t(B * T));
    targets.resize(size_t(B * T));
    for (auto& t : tokens) t = d(rng);
    for (auto& t : targets) t = d(rng);
  }
  GPTConfig cfg;
  const int B = 2, T = 32;
  std::mt19937_64 rng;
  std::vector<int32_t> tokens, targets;
};

TEST_P(Recomputation, GradientsAreBitwiseIdenticalAndMemoryDrops) {
  Case c(12);
  const GPTConfig& cfg = c.cfg;
  const int B = c.B, T = c.T;
  const std::vector<int32_t>&tokens = c.tokens, &targets = c.targets;

  const RunResult none = run_once(cfg, Recompute::none, GetParam(), tokens, targets, B, T);
  const RunResult sel = run_once(cfg, Recompute::selective, GetParam(), tokens, targets, B, T);
  const RunResult full = run_once(cfg, Recompute::full, GetParam(), tokens, targets, B, T);
  EXPECT_EQ(none.loss, sel.loss);
  EXPECT_EQ(none.loss, full.loss);
  ASSERT_EQ(none.grads.size(), full.grads.size());
  EXPECT_EQ(0, std::memcmp(none.grads.data(), sel.grads.data(), none.grads.size() * 4));
  EXPECT_EQ(0, std::memcmp(none.grads.data(), full.grads.data(), none.grads.size() * 4));

  std::printf("activation peak: none %zu, selective %zu, full %zu bytes (full/none = %.3f)\n", none.activation_peak,
              sel.activation_peak, full.activation_peak, double(full.activation_peak) / double(none.activation_peak));
  EXPECT_LT(sel.activation_peak, none.activation_peak);
  EXPECT_LE(3 * full.activation_peak, none.activation_peak);
}

// Packed documents: selective recompute rebuilds the attention probabilities in backward, and must
// mask them as the forward did (full recompute reruns the forward with its mask). The masked
// gradients differ from the unmasked ones, so a recompute that dropped the mask could not match.
TEST_P(Recomputation, DocumentMaskedGradientsAreBitwiseIdentical) {
  Case c(3);
  const GPTConfig& cfg = c.cfg;
  const int B = c.B, T = c.T;
  const std::vector<int32_t>&tokens = c.tokens, &targets = c.targets;
  std::mt19937_64& rng = c.rng;
  const std::vector<int32_t> docs = testing::random_doc_ids(B, T, rng);

  const RunResult none = run_once(cfg, Recompute::none, GetParam(), tokens, targets, B, T, docs.data());
  const RunResult unmasked = run_once(cfg, Recompute::none, GetParam(), tokens, targets, B, T);
  ASSERT_NE(0, std::memcmp(none.grads.data(), unmasked.grads.data(), none.grads.size() * 4)) << "the mask changed nothing";
  for (Recompute r : {Recompute::selective, Recompute::full}) {
    const RunResult got = run_once(cfg, r, GetParam(), tokens, targets, B, T, docs.data());
    EXPECT_EQ(none.loss, got.loss) << recompute_name(r);
    EXPECT_EQ(0, std::memcmp(none.grads.data(), got.grads.data(), none.grads.size() * 4)) << recompute_name(r);
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, Recomputation, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace mt::model
