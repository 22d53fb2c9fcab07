// GPT: parameter registration and initialisation. Forward/backward live in model/gpt_forward.cpp.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "runtime/check.h"

namespace mt::model {

void GPT::check_tensor_parallel(const GPTConfig& cfg, int tp) {
  if (tp <= 1) return;
  if (cfg.n_head % tp != 0)
    fail("--tp %d does not divide the model's %d attention heads (model.n_head): each rank needs whole heads", tp,
         cfg.n_head);
  if ((4 * cfg.n_embd) % tp != 0)
    fail("--tp %d does not divide the MLP's hidden width 4 x model.n_embd = %d", tp, 4 * cfg.n_embd);
  if (cfg.padded_vocab() % tp != 0)
    fail("--tp %d does not divide the padded vocabulary (%d = model.vocab_size %d rounded up to a multiple of 128)",
         tp, cfg.padded_vocab(), cfg.vocab_size);
}

StageContext::~StageContext() = default;

GPT::GPT(const GPTConfig& cfg, ParamStore& store, const parallel::TensorParallel& tp, const StagePlan& plan,
         const ExpertPlacement& experts)
    : cfg_(cfg),
      store_(store),
      tp_(tp),
      plan_(plan.chunks.empty() ? StagePlan::whole(cfg.n_layer) : plan),
      experts_(experts),
      xstore_(experts.apart() ? *experts.store : store) {
  cfg_.validate();
  check_tensor_parallel(cfg_, tp.size());
  MT_CHECK(!experts.apart() || (experts.store != nullptr && experts.store != &store),
           "expert placement over %d ranks without a store of its own", experts.ranks);
  MT_CHECK(!experts.apart() || (cfg_.moe.experts % experts.ranks == 0 && experts.rank >= 0 && experts.rank < experts.ranks),
           "expert placement: rank %d of %d for %d experts", experts.rank, experts.ranks, cfg_.moe.experts);
  const int L = cfg_.n_layer;
  for (size_t c = 0; c < plan_.chunks.size(); c++) {
    const StagePlan::Chunk& k = plan_.chunks[c];
    MT_CHECK(0 <= k.begin && k.begin < k.end && k.end <= L, "stage plan: chunk %zu holds layers [%d, %d) of %d", c,
             k.begin, k.end, L);
    MT_CHECK(c == 0 || plan_.chunks[c - 1].end <= k.begin, "stage plan: chunks out of order");
  }
  const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab(), P = tp.size();
  // Matrices (2-D) get weight decay; biases and LayerNorm parameters do not (as in GPT-2/nanoGPT).
  // A replicated parameter is a replica over tp; under sequence parallelism the ones applied to the
  // residual stream (LayerNorms, positions) see 1/tp of the rows, so their gradients are partial.
  const uint8_t rep = P > 1 ? kAxisTp : 0, seq = tp.splits_sequence() ? kAxisTp : 0;
  ParamStore* into = &store;  // where `whole` registers (the expert store for held-apart experts)
  auto whole = [&](const std::string& name, std::vector<int64_t> shape, bool wd, uint8_t partial) {
    ParamBox b{shape, std::vector<int64_t>(shape.size(), 0), shape};
    return into->add_part(name, shape, shape, std::move(b), wd, rep, partial);
  };
  // A matrix split along dimension `dim` of `space` (its global elements, possibly reshaped).
  auto split = [&](const std::string& name, std::vector<int64_t> shape, std::vector<int64_t> global,
                   std::vector<int64_t> space, int dim, uint8_t replicated = 0) {
    const bool matrix = global.size() > 1;
    return store.add_part(name, std::move(shape), std::move(global), tp.split(std::move(space), dim), matrix,
                          replicated);
  };
  // The tied embedding: one unit with the positions on a single stage; under pipeline parallelism a
  // unit of its own on the first and on the last stage (a replica over pp), the positions apart.
  const bool tied_pair = plan_.first != plan_.last;
  if (plan_.first || plan_.last) {
    emb_unit_ = store.num_units();
    store.begin_unit("embeddings");
    wte_ = split("transformer.wte.weight", {Vp / P, C}, {Vp, C}, {Vp, C}, 0, tied_pair ? kAxisPp : 0);  // vocabulary rows
  }
  if (plan_.first) {
    if (tied_pair) {
      pos_unit_ = store.num_units();
      store.begin_unit("positions");
    } else {
      pos_unit_ = emb_unit_;
    }
    wpe_ = whole("transformer.wpe.weight", {cfg.block_size, C}, true, seq);
  }
  layers_.assign(size_t(L), LayerParams());
  layer_units_.assign(size_t(L), -1);
  expert_units_.assign(size_t(L), -1);
  moe_bias_.assign(size_t(L), {});
  reset_moe_stats();
  for (const StagePlan::Chunk& k : plan_.chunks) {
    for (int l = k.begin; l < k.end; l++) {
      std::string p = "transformer.h." + std::to_string(l) + ".";
      layer_units_[size_t(l)] = store.num_units();
      store.begin_unit("h." + std::to_string(l));
      LayerParams& lp = layers_[size_t(l)];
      lp.ln1_w = whole(p + "ln_1.weight", {C}, false, seq);
      lp.ln1_b = whole(p + "ln_1.bias", {C}, false, seq);
      // c_attn's rows are [q | k | v], each C = heads x head size: seen as (3, C, C), a rank's heads
      // are one box.
      lp.qkv_w = split(p + "attn.c_attn.weight", {3 * C / P, C}, {3 * C, C}, {3, C, C}, 1);
      lp.qkv_b = split(p + "attn.c_attn.bias", {3 * C / P}, {3 * C}, {3, C}, 1);
      lp.proj_w = split(p + "attn.c_proj.weight", {C, C / P}, {C, C}, {C, C}, 1);  // input features
      lp.proj_b = whole(p + "attn.c_proj.bias", {C}, false, 0);  // its gradient is whole on every rank
      lp.ln2_w = whole(p + "ln_2.weight", {C}, false, seq);
      lp.ln2_b = whole(p + "ln_2.bias", {C}, false, seq);
      if (cfg_.is_moe_layer(l)) {
        // A mixture layer: the router and every expert a whole tensor of its own, so that expert
        // parallelism can place an expert on one rank.
        // Under tp each rank runs the whole mixture on its rows: replicas over tp, with partial gradients
        // under sequence parallelism (each rank's rows are 1/tp of them), as the LayerNorms.
        const int64_t E = cfg_.moe.experts;
        lp.router_w = whole(p + "mlp.router.weight", {E, C}, true, seq);
        auto mlp = [&](const std::string& q) {
          MlpParams m;
          m.fc_w = whole(q + "c_fc.weight", {4 * C, C}, true, seq);
          m.fc_b = whole(q + "c_fc.bias", {4 * C}, false, seq);
          m.proj_w = whole(q + "c_proj.weight", {C, 4 * C}, true, seq);
          m.proj_b = whole(q + "c_proj.bias", {C}, false, seq);
          return m;
        };
        // Held apart (expert parallelism): this rank's experts only, a unit of their own in the expert
        // store; the others stay -1, as in a layer another stage holds.
        const int per = cfg_.moe.experts / experts_.ranks, lo = experts_.rank * per;
        if (experts_.apart()) {
          expert_units_[size_t(l)] = xstore_.num_units();
          xstore_.begin_unit("h." + std::to_string(l) + ".experts");
          into = &xstore_;
        }
        lp.experts.assign(size_t(cfg_.moe.experts), MlpParams{});
        for (int e = lo; e < lo + per; e++) lp.experts[size_t(e)] = mlp(p + "mlp.experts." + std::to_string(e) + ".");
        into = &store;
        for (int e = 0; e < cfg_.moe.shared; e++)
          lp.shared.push_back(mlp(p + "mlp.shared_experts." + std::to_string(e) + "."));
        moe_bias_[size_t(l)].assign(size_t(E), 0.f);
        continue;
      }
      lp.fc_w = split(p + "mlp.c_fc.weight", {4 * C / P, C}, {4 * C, C}, {4 * C, C}, 0);  // output features
      lp.fc_b = split(p + "mlp.c_fc.bias", {4 * C / P}, {4 * C}, {4 * C}, 0);
      lp.fcproj_w = split(p + "mlp.c_proj.weight", {C, 4 * C / P}, {C, 4 * C}, {C, 4 * C}, 1);
      lp.fcproj_b = whole(p + "mlp.c_proj.bias", {C}, false, 0);
    }
  }
  if (plan_.last) {
    final_unit_ = store.num_units();
    store.begin_unit("ln_f");
    lnf_w_ = whole("transformer.ln_f.weight", {C}, false, seq);
    lnf_b_ = whole("transformer.ln_f.bias", {C}, false, seq);
  }
}

void GPT::init_weights(uint64_t seed) {
  MT_CHECK(store_.finalized(), "init_weights before the ParamStore is finalized");
  MT_CHECK(store_.master() != nullptr, "init_weights needs the full master weights");
  // A pipeline stage without mixture layers holds no experts: its expert store stays empty (unfinalized).
  const bool apart = experts_.apart() && !xstore_.entries().empty();
  MT_CHECK(!apart || (xstore_.finalized() && xstore_.master()), "init_weights: the expert store is not ready");
  std::mt19937_64 rng(seed);
  // Built on the host (in place when the master is host memory), then uploaded in one copy; the same
  // for the expert store when the experts are held apart.
  const bool on_host = store_.mem().device == Device::cpu;
  std::vector<float> staging(on_host ? 0 : size_t(store_.total_numel()));
  float* master = on_host ? store_.master() : staging.data();
  std::vector<float> xstaging(on_host || !apart ? 0 : size_t(xstore_.total_numel()));
  float* xmaster = !apart ? master : on_host ? xstore_.master() : xstaging.data();
  const ParamStore* in = &store_;  // the store `normal` writes into
  float* in_master = master;
  const float std0 = 0.02f;
  const float std_res = std0 / std::sqrt(2.0f * float(cfg_.n_layer));
  const int64_t C = cfg_.n_embd;
  // Each tensor is drawn whole (its global shape), in the order and with the draws a single rank
  // makes, and this rank keeps its box: every layout, pipeline stages included (a stage draws the
  // tensors it does not hold too), starts from the same model.
  std::vector<float> whole;
  auto keep_box = [&](const ParamEntry& e) {
    float* w = in_master + e.offset;
    for_each_global_run(e, 0, e.numel, [&](int64_t gb, int64_t ge, int64_t local) {
      std::copy(whole.begin() + gb, whole.begin() + ge, w + local);
    });
  };
  // idx < 0: a tensor of `rows` x `cols` that another stage holds: drawn all the same.
  auto normal = [&](int idx, int64_t rows, int64_t cols, float std, int64_t rows_used = -1) {
    std::normal_distribution<float> d(0.f, std);
    whole.assign(size_t(rows * cols), 0.f);  // padded vocabulary rows stay zero
    const int64_t n = (rows_used < 0 ? rows : rows_used) * cols;
    for (int64_t i = 0; i < n; i++) whole[size_t(i)] = d(rng);
    if (idx >= 0) keep_box(in->entry(idx));
  };
  auto fill = [&](int idx, float v) {
    if (idx < 0) return;
    const ParamEntry& e = in->entry(idx);
    float* w = in_master + e.offset;
    for (int64_t i = 0; i < e.numel; i++) w[i] = v;
  };
  normal(wte_, cfg_.padded_vocab(), C, std0, cfg_.vocab_size);
  normal(wpe_, cfg_.block_size, C, std0);
  for (size_t l = 0; l < layers_.size(); l++) {
    const LayerParams& lp = layers_[l];
    fill(lp.ln1_w, 1.f);
    fill(lp.ln1_b, 0.f);
    normal(lp.qkv_w, 3 * C, C, std0);
    fill(lp.qkv_b, 0.f);
    normal(lp.proj_w, C, C, std_res);
    fill(lp.proj_b, 0.f);
    fill(lp.ln2_w, 1.f);
    fill(lp.ln2_b, 0.f);
    if (cfg_.is_moe_layer(int(l))) {
      // The router, then each expert and shared expert as a dense MLP is drawn (all -1, drawn and
      // dropped, in a layer another stage holds).
      normal(lp.router_w, cfg_.moe.experts, C, std0);
      for (const auto& [group, n] : {std::pair{&lp.experts, cfg_.moe.experts}, std::pair{&lp.shared, cfg_.moe.shared}})
        for (int k = 0; k < n; k++) {
          const MlpParams m = size_t(k) < group->size() ? (*group)[size_t(k)] : MlpParams{};
          const bool routed = group == &lp.experts;
          in = routed ? &xstore_ : &store_;
          in_master = routed ? xmaster : master;
          normal(m.fc_w, 4 * C, C, std0);
          fill(m.fc_b, 0.f);
          normal(m.proj_w, C, 4 * C, std_res);
          fill(m.proj_b, 0.f);
          in = &store_;
          in_master = master;
        }
      continue;
    }
    normal(lp.fc_w, 4 * C, C, std0);
    fill(lp.fc_b, 0.f);
    normal(lp.fcproj_w, C, 4 * C, std_res);
    fill(lp.fcproj_b, 0.f);
  }
  fill(lnf_w_, 1.f);
  fill(lnf_b_, 0.f);
  if (!on_host) store_.mem().upload(store_.master(), master, staging.size() * sizeof(float));
  if (store_.full_compute()) store_.refresh_compute();  // else the sharding engine derives compute
  if (!apart) return;
  if (!on_host) xstore_.mem().upload(xstore_.master(), xmaster, xstaging.size() * sizeof(float));
  if (xstore_.full_compute()) xstore_.refresh_compute();
}

void GPT::reset_moe_stats() {
  moe_stats_.assign(size_t(cfg_.n_layer), MoeLayerStats());
  for (int l = 0; l < cfg_.n_layer; l++)
    if (cfg_.is_moe_layer(l)) moe_stats_[size_t(l)].load.assign(size_t(cfg_.moe.experts), 0);
}

void GPT::check_batch(const MicroBatch& mb) const {
  if (mb.B <= 0 || mb.T <= 0) fail("batch size and sequence length must be positive (got B=%d, T=%d)", mb.B, mb.T);
  if (mb.T > cfg_.block_size)
    fail("sequence length %d is longer than the model's context (model.block_size = %d)", mb.T, cfg_.block_size);
  MT_CHECK(mb.tokens != nullptr, "micro-batch without tokens");
  MT_CHECK(!cp_.active() || mb.positions, "context parallelism: a micro-batch without its global positions");
  const int64_t n = int64_t(mb.B) * mb.T;
  if (tp_.splits_sequence() && n % tp_.size() != 0)
    fail("sequence parallelism: the rows of a micro-batch, B %d x T %d, must be divisible by --tp %d", mb.B, mb.T,
         tp_.size());
  for (int64_t i = 0; i < n; i++) {
    if (mb.tokens[i] < 0 || mb.tokens[i] >= cfg_.vocab_size)
      fail("token id %d at position %lld is outside the model's vocabulary (vocab_size = %d)", mb.tokens[i],
           (long long)i, cfg_.vocab_size);
    if (mb.targets && mb.targets[i] >= cfg_.vocab_size)
      fail("target id %d at position %lld is outside the model's vocabulary (vocab_size = %d)", mb.targets[i],
           (long long)i, cfg_.vocab_size);
    if (mb.positions && (mb.positions[i] < 0 || mb.positions[i] >= cfg_.block_size))
      fail("position %d at index %lld is outside [0, block_size=%d)", mb.positions[i], (long long)i,
           cfg_.block_size);
  }
}

}  // namespace mt::model
