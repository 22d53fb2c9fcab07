// GPT: parameter registration and initialisation. Forward/backward live in model/gpt_forward.cpp.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "runtime/check.h"

namespace mt::model {

Recompute recompute_from_name(const std::string& s) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  fail("--recompute must be none, selective or full (got '%s')", s.c_str());
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

Attention attention_from_name(const std::string& s) {
  if (s == "materialized") return Attention::materialized;
  if (s == "flash") return Attention::flash;
  fail("--attention must be materialized or flash (got '%s')", s.c_str());
}

const char* attention_name(Attention a) { return a == Attention::flash ? "flash" : "materialized"; }

GPT::GPT(const GPTConfig& cfg, ParamStore& store) : cfg_(cfg), store_(store) {
  cfg_.validate();
  const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab();
  // Matrices (2-D) get weight decay; biases and LayerNorm parameters do not (as in GPT-2/nanoGPT).
  store.begin_unit("embeddings");
  wte_ = store.add("transformer.wte.weight", {Vp, C}, true);
  wpe_ = store.add("transformer.wpe.weight", {cfg.block_size, C}, true);
  for (int l = 0; l < cfg.n_layer; l++) {
    std::string p = "transformer.h." + std::to_string(l) + ".";
    store.begin_unit("h." + std::to_string(l));
    LayerParams lp;
    lp.ln1_w = store.add(p + "ln_1.weight", {C}, false);
    lp.ln1_b = store.add(p + "ln_1.bias", {C}, false);
    lp.qkv_w = store.add(p + "attn.c_attn.weight", {3 * C, C}, true);
    lp.qkv_b = store.add(p + "attn.c_attn.bias", {3 * C}, false);
    lp.proj_w = store.add(p + "attn.c_proj.weight", {C, C}, true);
    lp.proj_b = store.add(p + "attn.c_proj.bias", {C}, false);
    lp.ln2_w = store.add(p + "ln_2.weight", {C}, false);
    lp.ln2_b = store.add(p + "ln_2.bias", {C}, false);
    lp.fc_w = store.add(p + "mlp.c_fc.weight", {4 * C, C}, true);
    lp.fc_b = store.add(p + "mlp.c_fc.bias", {4 * C}, false);
    lp.fcproj_w = store.add(p + "mlp.c_proj.weight", {C, 4 * C}, true);
    lp.fcproj_b = store.add(p + "mlp.c_proj.bias", {C}, false);
    layers_.push_back(lp);
  }
  store.begin_unit("ln_f");
  lnf_w_ = store.add("transformer.ln_f.weight", {C}, false);
  lnf_b_ = store.add("transformer.ln_f.bias", {C}, false);
}

void GPT::init_weights(uint64_t seed) {
  MT_CHECK(store_.finalized(), "init_weights before the ParamStore is finalized");
  MT_CHECK(store_.master() != nullptr, "init_weights needs the full master weights");
  std::mt19937_64 rng(seed);
  // Built on the host (in place when the master is host memory), then uploaded in one copy.
  const bool on_host = store_.mem().device == Device::cpu;
  std::vector<float> staging(on_host ? 0 : size_t(store_.total_numel()));
  float* master = on_host ? store_.master() : staging.data();
  const float std0 = 0.02f;
  const float std_res = std0 / std::sqrt(2.0f * float(cfg_.n_layer));
  auto normal = [&](int idx, float std, int64_t rows_used = -1) {
    const ParamEntry& e = store_.entry(idx);
    std::normal_distribution<float> d(0.f, std);
    float* w = master + e.offset;
    int64_t n = rows_used < 0 ? e.numel : rows_used * e.shape[1];
    for (int64_t i = 0; i < n; i++) w[i] = d(rng);
    for (int64_t i = n; i < e.numel; i++) w[i] = 0.f;  // padded vocabulary rows stay zero
  };
  auto fill = [&](int idx, float v) {
    const ParamEntry& e = store_.entry(idx);
    float* w = master + e.offset;
    for (int64_t i = 0; i < e.numel; i++) w[i] = v;
  };
  normal(wte_, std0, cfg_.vocab_size);
  normal(wpe_, std0);
  for (const LayerParams& lp : layers_) {
    fill(lp.ln1_w, 1.f);
    fill(lp.ln1_b, 0.f);
    normal(lp.qkv_w, std0);
    fill(lp.qkv_b, 0.f);
    normal(lp.proj_w, std_res);
    fill(lp.proj_b, 0.f);
    fill(lp.ln2_w, 1.f);
    fill(lp.ln2_b, 0.f);
    normal(lp.fc_w, std0);
    fill(lp.fc_b, 0.f);
    normal(lp.fcproj_w, std_res);
    fill(lp.fcproj_b, 0.f);
  }
  fill(lnf_w_, 1.f);
  fill(lnf_b_, 0.f);
  if (!on_host) store_.mem().upload(store_.master(), master, staging.size() * sizeof(float));
  if (store_.full_compute()) store_.refresh_compute();  // else the sharding engine derives compute
}

void GPT::check_batch(const MicroBatch& mb) const {
  if (mb.B <= 0 || mb.T <= 0) fail("batch size and sequence length must be positive (got B=%d, T=%d)", mb.B, mb.T);
  if (mb.T > cfg_.block_size)
    fail("sequence length %d is longer than the model's context (model.block_size = %d)", mb.T, cfg_.block_size);
  MT_CHECK(mb.tokens != nullptr, "micro-batch without tokens");
  const int64_t n = int64_t(mb.B) * mb.T;
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
