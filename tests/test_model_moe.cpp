// A GPT with mixture-of-experts layers: parameters named per expert, the whole model's gradient
// (cross-entropy plus the load-balancing and z-losses, with and without capacity drops, shared
// experts, dense and mixture layers mixed) against finite differences, recompute modes bitwise equal
// and counting each forward once, zb1's split backward bitwise the unsplit one, and 16-bit runs close
// to fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "tests/test_util.h"

namespace mt::model {
namespace {

GPTConfig small_moe(double capacity, int shared) {
  GPTConfig c;
  c.vocab_size = 61;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_head = 2;
  c.n_embd = 16;
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.every = 1;
  c.moe.capacity = capacity;
  c.moe.shared = shared;
  c.moe.aux_coef = 0.5;  // large, so that a wrong aux or z gradient shows
  c.moe.z_coef = 0.05;
  return c;
}

struct Model {
  explicit Model(const GPTConfig& cfg, DType precision = DType::f32) : gpt(cfg, store) {
    store.finalize(arena, precision);
    gpt.init_weights(7);
    gpt.set_arena(&arena);
  }
  Arena arena;
  ParamStore store;
  GPT gpt;
};

struct Batch {
  Batch(int V, std::mt19937_64& rng) {
    tokens = testing::random_ints(size_t(B * T), 0, V - 1, rng);
    targets = testing::random_ints(size_t(B * T), 0, V - 1, rng);
  }
  MicroBatch mb() const { return MicroBatch{B, T, tokens.data(), targets.data(), nullptr, nullptr}; }
  const int B = 4, T = 16;
  std::vector<int32_t> tokens, targets;
};

// The objective the model differentiates with dloss = 1: the token losses' sum plus, per mixture
// layer, N (aux_coef A + z_coef Z) (balance = aux). Also each layer's loads and routing fingerprint, to
// see routing changes (equal loads can hide two tokens trading experts, or a different token dropped).
double objective(Model& m, const Batch& b, std::vector<int64_t>* loads) {
  m.gpt.reset_moe_stats();
  double j = m.gpt.forward_loss(b.mb());
  const MoeConfig& mc = m.gpt.config().moe;
  if (loads) loads->clear();
  for (const MoeLayerStats& s : m.gpt.moe_stats()) {
    if (s.load.empty()) continue;
    j += mc.aux_coef * s.balance + mc.z_coef * s.z;  // balance, z: already N x the value
    if (loads) {
      loads->insert(loads->end(), s.load.begin(), s.load.end());
      loads->push_back(int64_t(s.routing_hash));
    }
  }
  return j;
}

TEST(MoeModel, ParametersAreNamedPerExpertAndCountedAsConfigured) {
  GPTConfig cfg = GPTConfig::preset("tiny-moe");
  cfg.moe.shared = 1;
  ParamStore s;
  GPT g(cfg, s);
  const int64_t C = cfg.n_embd;
  ASSERT_NE(s.find("transformer.h.1.mlp.experts.3.c_fc.weight"), nullptr);
  EXPECT_EQ(s.find("transformer.h.1.mlp.experts.3.c_fc.weight")->global_shape, (std::vector<int64_t>{4 * C, C}));
  ASSERT_NE(s.find("transformer.h.1.mlp.router.weight"), nullptr);
  EXPECT_EQ(s.find("transformer.h.1.mlp.router.weight")->global_shape, (std::vector<int64_t>{4, C}));
  EXPECT_NE(s.find("transformer.h.3.mlp.shared_experts.0.c_proj.bias"), nullptr);
  EXPECT_EQ(s.find("transformer.h.1.mlp.c_fc.weight"), nullptr);  // no dense MLP in a mixture layer
  EXPECT_NE(s.find("transformer.h.0.mlp.c_fc.weight"), nullptr);  // layer 0 is dense (every = 2)
  EXPECT_EQ(s.find("transformer.h.0.mlp.router.weight"), nullptr);
  EXPECT_EQ(s.find("transformer.h.1.mlp.experts.4.c_fc.weight"), nullptr);
  // Totals from the registered tensors: every element (the padded vocabulary rows aside); active
  // leaves out the experts a token skips; matmul counts the matrices a token multiplies by.
  int64_t total = 0, idle = 0, matmul = 0;
  for (const ParamEntry& e : s.entries()) {
    total += e.numel;
    const size_t ex = e.name.find("mlp.experts.");
    const bool skipped = ex != std::string::npos && std::stoi(e.name.substr(ex + 12)) >= cfg.moe.top_k;
    if (skipped) idle += e.numel;
    if (e.shape.size() == 2 && e.name != "transformer.wpe.weight" && !skipped) matmul += e.numel;
  }
  total -= int64_t(cfg.padded_vocab() - cfg.vocab_size) * C;
  matmul -= int64_t(cfg.padded_vocab() - cfg.vocab_size) * C;
  EXPECT_EQ(cfg.num_params(), total);
  EXPECT_EQ(cfg.num_active_params(), total - idle);
  EXPECT_EQ(cfg.num_matmul_params(), matmul);
  EXPECT_LT(cfg.num_active_params(), cfg.num_params());
  GPTConfig dense = GPTConfig::preset("tiny");
  EXPECT_EQ(dense.num_active_params(), dense.num_params());
  EXPECT_DOUBLE_EQ(dense.flops_per_token(64), 6.0 * (4 * 12.0 * 128 * 128 + 512 * 128) + 12.0 * 4 * 128 * 64);
}

// Directional derivatives along a random direction per tensor, which sums many coordinates' worth of
// signal against fp32's rounding. A step that changes any routing decision is retried smaller. The
// routers' sharp softmax (weights x 50) curves the loss along a tensor that feeds a later router, so
// the central difference is extrapolated (Richardson: 4 D(h/2) - D(h), over 3) to cancel its h^2 term.
// The gradient on one batch; returns how many mixture tensors were checked.
int check_gradient_on(Model& m, const GPTConfig& cfg, std::mt19937_64& rng, const char* label) {
  Batch b(cfg.vocab_size, rng);
  m.store.zero_grads();
  m.gpt.reset_moe_stats();
  m.gpt.forward_backward(b.mb(), 1.f);
  const std::vector<float> grads(m.store.grads(), m.store.grads() + m.store.total_numel());
  std::vector<int64_t> loads0;
  objective(m, b, &loads0);
  float* master = m.store.master();
  int checked = 0;
  for (const ParamEntry& e : m.store.entries()) {
    const bool moe = e.name.find("mlp.") != std::string::npos && e.name.find("mlp.c_") == std::string::npos;
    if (!moe && e.name.find("ln_2.weight") == std::string::npos && e.name.find("attn.c_attn.weight") == std::string::npos)
      continue;
    std::vector<float> dir = testing::random_floats(size_t(e.numel), rng);
    double analytic = 0;
    for (int64_t i = 0; i < e.numel; i++) analytic += double(grads[size_t(e.offset + i)]) * dir[size_t(i)];
    std::vector<float> keep(master + e.offset, master + e.offset + e.numel);
    // The central difference at step h, or NaN when either side routed differently.
    auto central = [&](double h) {
      std::vector<int64_t> lp, lm;
      for (int64_t i = 0; i < e.numel; i++) master[e.offset + i] = keep[size_t(i)] + float(h) * dir[size_t(i)];
      const double jp = objective(m, b, &lp);
      for (int64_t i = 0; i < e.numel; i++) master[e.offset + i] = keep[size_t(i)] - float(h) * dir[size_t(i)];
      const double jm = objective(m, b, &lm);
      std::copy(keep.begin(), keep.end(), master + e.offset);
      return lp == loads0 && lm == loads0 ? (jp - jm) / (2 * h) : NAN;
    };
    // Two steps; below the second, fp32's rounding of the objective (|J| 2^-23 per evaluation, some
    // 600 here) would swamp a small derivative, so a tensor whose every step flips a route is left out.
    double fd = NAN, step = 0;
    for (double eps : {2e-3, 5e-4}) {
      if (!std::isnan(fd)) break;
      fd = (4 * central(eps / 2) - central(eps)) / 3;
      step = eps;
    }
    if (std::isnan(fd)) continue;
    // The bound: 3% of the derivative, plus the extrapolation's rounding, 3 |J| 2^-23 / h at most
    // (a third of that is what the runs show).
    const double rounding = std::fabs(objective(m, b, nullptr)) * std::ldexp(1.0, -23) / step;
    EXPECT_NEAR(analytic, fd, 3e-2 * std::fabs(fd) + 3e-3 + rounding) << label << ": " << e.name << " (step " << step << ")";
    checked += moe;
  }
  return checked;
}

// The routers' margins are random: a few tokens of a batch sit near a tie, and a batch may hold one
// so close that every step of the tensors before it flips its route (seen: 24 of 51 checked, against
// 43-48 for other seeds). Such a batch checks little, so another is drawn, up to three; half the
// tensors at least are checked on the last, and over seeds every one.
void check_gradient(const GPTConfig& cfg, const char* label) {
  std::mt19937_64 rng(testing::test_seed());
  Model m(cfg);
  // Routers as initialised give nearly uniform probabilities, whose top-k flips under the smallest
  // step; larger router weights give the choices margins (the gradient is the same function).
  for (const ParamEntry& e : m.store.entries())
    if (e.name.find("router") != std::string::npos)
      for (int64_t i = 0; i < e.numel; i++) m.store.master()[e.offset + i] *= 50.f;
  const int tensors = cfg.num_moe_layers() * (1 + 4 * (cfg.moe.experts + cfg.moe.shared));
  int checked = 0;
  for (int draw = 0; draw < 3 && 2 * checked < tensors; draw++) {
    checked = check_gradient_on(m, cfg, rng, label);
    std::printf("%s, batch %d: %d of the %d mixture tensors checked\n", label, draw + 1, checked, tensors);
  }
  EXPECT_GE(2 * checked, tensors) << label << ": " << checked << " of " << tensors << " mixture tensors checked";
}

TEST(MoeModel, WholeModelGradientMatchesFiniteDifferences) {
  check_gradient(small_moe(0, 0), "dropless");
  check_gradient(small_moe(0.75, 1), "capacity 0.75, one shared expert");
  GPTConfig mixed = small_moe(0, 0);
  mixed.moe.every = 2;  // layer 1 only
  mixed.moe.top_k = 1;
  check_gradient(mixed, "top-1 in every other layer");
}

TEST(MoeModel, RecomputeModesGiveBitwiseEqualGradientsAndCountEachForwardOnce) {
  std::mt19937_64 rng(testing::test_seed());
  const GPTConfig cfg = small_moe(0.75, 1);
  Batch b(cfg.vocab_size, rng);
  std::vector<std::vector<float>> grads;
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
    Model m(cfg);
    m.gpt.set_recompute(r);
    m.store.zero_grads();
    m.gpt.reset_moe_stats();
    m.gpt.forward_backward(b.mb(), 1.f / 64);
    grads.emplace_back(m.store.grads(), m.store.grads() + m.store.total_numel());
    for (const MoeLayerStats& s : m.gpt.moe_stats()) {
      EXPECT_EQ(s.tokens, b.B * b.T) << recompute_name(r);
      EXPECT_EQ(s.assignments, int64_t(b.B) * b.T * cfg.moe.top_k);
      EXPECT_GT(s.dropped, 0);
    }
    EXPECT_EQ(m.arena.stats().live[size_t(MemCategory::activations)], 0u) << "activations leaked";
  }
  EXPECT_EQ(0, std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * 4));
  EXPECT_EQ(0, std::memcmp(grads[0].data(), grads[2].data(), grads[0].size() * 4));
}

// zb1's split backward of mixture layers (GPT::stage_backward_input, then stage_backward_weight): the
// input-gradient pass adds no gradient to the experts, routers or shared experts (they wait for W),
// and after W every weight gradient -- theirs and the dense layers', LayerNorms and embeddings
// included -- is bitwise the unsplit backward's, with the same loss, in fp32 and bf16, with and
// without full recompute, dropless and with capacity drops; nothing is left in the arena.
TEST(MoeModel, SplitBackwardGradientsAreBitwiseTheUnsplitBackwards) {
  std::mt19937_64 rng(testing::test_seed());
  GPTConfig mixed = small_moe(0, 0);
  mixed.moe.every = 2;  // layer 1 only: dense layers around a mixture
  for (const GPTConfig& cfg : {small_moe(0.75, 1), mixed}) {
    Batch b(cfg.vocab_size, rng);
    for (DType t : {DType::f32, DType::bf16})
      for (Recompute r : {Recompute::none, Recompute::full}) {
        const std::string what = std::string(dtype_name(t)) + " recompute=" + recompute_name(r) +
                                 " capacity=" + std::to_string(cfg.moe.capacity);
        Model whole(cfg, t), split(cfg, t);
        whole.gpt.set_recompute(r);
        split.gpt.set_recompute(r);
        whole.store.zero_grads();
        split.store.zero_grads();
        const double want = whole.gpt.forward_backward(b.mb(), 1.f / 64);
        std::unique_ptr<StageContext> ctx = split.gpt.stage_forward(0, b.mb(), Buffer(), 1.f / 64, true);
        EXPECT_FALSE(split.gpt.stage_backward_input(*ctx, Buffer())) << "stage 0 has no input gradient";
        int deferred = 0;
        for (const ParamEntry& e : split.store.entries()) {
          const bool moe = e.name.find("mlp.") != std::string::npos && e.name.find("mlp.c_") == std::string::npos;
          if (!moe) continue;
          deferred++;
          for (int64_t i = 0; i < e.numel; i++)
            ASSERT_EQ(split.store.grads()[e.offset + i], 0.f) << what << ": " << e.name << " before W";
        }
        EXPECT_GT(deferred, 0);
        split.gpt.stage_backward_weight(*ctx);
        EXPECT_EQ(split.gpt.stage_loss(*ctx), want) << what;
        ctx.reset();
        for (const ParamEntry& e : whole.store.entries())
          EXPECT_EQ(0, std::memcmp(split.store.grads() + e.offset, whole.store.grads() + e.offset, size_t(e.numel) * 4))
              << what << ": the gradient of " << e.name << " differs from the unsplit backward's";
        EXPECT_EQ(split.arena.stats().live[size_t(MemCategory::activations)], 0u) << what << ": activations leaked";
      }
  }
}

// A step's gradients start from stale buffers that zero_grads does not touch: each weight GEMM's
// first contribution is written over them, every other writer finds its entry zeroed first, and an
// expert that gets no rows is zeroed when the gradient is read. Over NaN-filled entries, two
// micro-batches accumulated give the bits of buffers zeroed in full beforehand (dense and mixture
// layers, shared experts, the tied embedding), in fp32 and bf16, with experts left idle.
TEST(MoeModel, GradientsOverStaleBuffersAreTheBitsOfZeroedOnes) {
  std::mt19937_64 rng(testing::test_seed());
  GPTConfig cfg = small_moe(0, 1);
  cfg.moe.experts = 8;
  cfg.moe.top_k = 1;
  cfg.moe.every = 2;  // layer 1 only
  const int T = 3;    // three tokens a micro-batch for eight experts: most get none
  std::vector<std::vector<int32_t>> tokens, targets;
  for (int k = 0; k < 2; k++) {
    tokens.push_back(testing::random_ints(T, 0, cfg.vocab_size - 1, rng));
    targets.push_back(testing::random_ints(T, 0, cfg.vocab_size - 1, rng));
  }
  for (DType t : {DType::f32, DType::bf16}) {
    Model lazy(cfg, t), eager(cfg, t);
    const int n = int(lazy.store.entries().size());
    for (int i = 0; i < n; i++) std::fill_n(lazy.store.grad(i), lazy.store.entry(i).numel, std::nanf(""));
    lazy.store.zero_grads();
    eager.store.zero_grads();
    eager.store.settle_grads();  // all zeroed now: every writer adds
    for (Model* m : {&lazy, &eager})
      for (int k = 0; k < 2; k++)
        m->gpt.forward_backward(MicroBatch{1, T, tokens[size_t(k)].data(), targets[size_t(k)].data(), nullptr, nullptr},
                                1.f / 64);
    int idle = 0;
    for (int i = 0; i < n; i++) {
      const ParamEntry& e = lazy.store.entry(i);
      const float *got = lazy.store.grad(i), *want = eager.store.grad(i);
      EXPECT_EQ(0, std::memcmp(got, want, size_t(e.numel) * 4)) << dtype_name(t) << ": " << e.name;
      if (e.name.find(".experts.") != std::string::npos && e.name.find("c_fc.weight") != std::string::npos &&
          std::all_of(got, got + e.numel, [](float x) { return x == 0.f; }))
        idle++;
    }
    EXPECT_GE(idle, 2) << "experts with no rows in either micro-batch";
    const float* all = lazy.store.grads();
    EXPECT_TRUE(std::none_of(all, all + lazy.store.total_numel(), [](float x) { return std::isnan(x); }))
        << dtype_name(t) << ": a stale value survived";
  }
}

TEST(MoeModel, SixteenBitRunsStayCloseToFp32) {
  std::mt19937_64 rng(testing::test_seed());
  const GPTConfig cfg = small_moe(0, 1);
  Batch b(cfg.vocab_size, rng);
  Model f(cfg);
  const double want = f.gpt.forward_loss(b.mb());
  for (DType t : {DType::bf16, DType::f16}) {
    Model m(cfg, t);
    m.store.zero_grads();
    const double got = m.gpt.forward_backward(b.mb(), 1.f / 64);
    EXPECT_NEAR(got / 64, want / 64, 0.02) << dtype_name(t);
    for (int64_t i = 0; i < m.store.total_numel(); i++) ASSERT_TRUE(std::isfinite(m.store.grads()[i])) << dtype_name(t);
  }
}

}  // namespace
}  // namespace mt::model
