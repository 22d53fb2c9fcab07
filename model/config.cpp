#include "model/config.h"

#include <cmath>

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

MoeBalance moe_balance_from_name(const std::string& s) {
  if (s == "aux") return MoeBalance::aux;
  if (s == "bias") return MoeBalance::bias;
  if (s == "none") return MoeBalance::none;
  fail("moe.balance must be aux, bias or none (got '%s')", s.c_str());
}

const char* moe_balance_name(MoeBalance b) {
  return b == MoeBalance::aux ? "aux" : b == MoeBalance::bias ? "bias" : "none";
}

int GPTConfig::num_moe_layers() const {
  int n = 0;
  for (int l = 0; l < n_layer; l++) n += is_moe_layer(l);
  return n;
}

namespace {
// One GPT-2 MLP (c_fc and c_proj with their biases) of width C.
int64_t mlp_params(int64_t C) { return C * 4 * C + 4 * C + 4 * C * C + C; }
}  // namespace

int64_t GPTConfig::num_params() const {
  int64_t C = n_embd, L = n_layer;
  int64_t per_layer = 2 * C            // ln_1
                      + C * 3 * C + 3 * C  // c_attn
                      + C * C + C      // attn c_proj
                      + 2 * C          // ln_2
                      + mlp_params(C);  // c_fc, mlp c_proj
  // A mixture layer: a router and experts + shared MLPs in place of the one MLP.
  const int64_t moe_extra = int64_t(moe.experts) * C + int64_t(moe.experts + moe.shared - 1) * mlp_params(C);
  return int64_t(vocab_size) * C + int64_t(block_size) * C + L * per_layer + num_moe_layers() * moe_extra + 2 * C;
}

int64_t GPTConfig::num_active_params() const {
  const int64_t C = n_embd;
  const int64_t idle = int64_t(moe.experts - moe.top_k) * mlp_params(C);  // experts a token skips
  return num_params() - num_moe_layers() * idle;
}

int64_t GPTConfig::layer_matmul_params() const {
  const int64_t C = n_embd;
  const int64_t moe_extra = int64_t(moe.experts) * C + int64_t(moe.top_k + moe.shared - 1) * 8 * C * C;
  return int64_t(n_layer) * 12 * C * C + num_moe_layers() * moe_extra;
}

int64_t GPTConfig::num_matmul_params() const { return layer_matmul_params() + int64_t(vocab_size) * n_embd; }

double GPTConfig::flops_per_token(int T) const {
  return 6.0 * double(num_matmul_params()) + 12.0 * n_layer * double(n_embd) * T;
}

double attention_flops_per_token(const GPTConfig& cfg, int T, Recompute r, Attention a,
                                 Device device) {
  const double attn_fwd = 4.0 * cfg.n_layer * double(cfg.n_embd) * T;  // Q K^T and P V
  double f = 3.0 * attn_fwd;                                            // forward and backward
  if (r == Recompute::full) f += attn_fwd;
  if (a == Attention::flash) {
    // The flash backward recomputes what it did not store. The CPU's recomputes Q K^T once
    // (kernels/cpu/flash_attention.cpp). The GPU's runs two kernels so that no sum needs atomics
    // (kernels/cuda/flash_attention*.cu): Q K^T in both and dO V^T again in the second. Each product
    // is attn_fwd / 2. There is no separate selective recompute.
    f += (device == Device::cuda ? 3 : 1) * attn_fwd / 2;
  } else if (r == Recompute::selective) {
    f += attn_fwd;
  }
  return f;
}

double hardware_flops_per_token(const GPTConfig& cfg, int T, Recompute r, Attention a,
                                Device device) {
  double f = 6.0 * double(cfg.num_matmul_params());
  if (r == Recompute::full) f += 2.0 * double(cfg.layer_matmul_params());
  return f + attention_flops_per_token(cfg, T, r, a, device);
}

void GPTConfig::validate() const {
  if (vocab_size <= 0) fail("model.vocab_size must be positive (got %d)", vocab_size);
  if (block_size <= 0) fail("model.block_size must be positive (got %d)", block_size);
  if (n_layer <= 0) fail("model.n_layer must be positive (got %d)", n_layer);
  if (n_head <= 0) fail("model.n_head must be positive (got %d)", n_head);
  if (n_embd <= 0) fail("model.n_embd must be positive (got %d)", n_embd);
  if (n_embd % n_head != 0)
    fail("model.n_embd (%d) must be divisible by model.n_head (%d)", n_embd, n_head);
  if (moe.experts < 0) fail("moe.experts must not be negative (got %d)", moe.experts);
  if (moe.experts == 0) {
    if (moe.shared > 0) fail("moe.shared=%d needs a mixture of experts (moe.experts > 0)", moe.shared);
    return;
  }
  if (moe.top_k < 1) fail("moe.top_k must be positive (got %d)", moe.top_k);
  if (moe.top_k > moe.experts)
    fail("moe.top_k %d is larger than moe.experts %d: a token cannot use more experts than there are", moe.top_k,
         moe.experts);
  if (moe.every < 1) fail("moe.every must be positive (got %d)", moe.every);
  if (moe.every > n_layer)
    fail("moe.every %d is larger than model.n_layer %d: no layer would be a mixture of experts", moe.every, n_layer);
  if (!std::isfinite(moe.capacity) || moe.capacity < 0)
    fail("moe.capacity must not be negative (got %g; 0 = dropless)", moe.capacity);
  if (moe.capacity > 0 && moe.capacity * moe.top_k < 1e-9)
    fail("moe.capacity %g is too small to hold any token", moe.capacity);
  if (!std::isfinite(moe.aux_coef) || moe.aux_coef < 0) fail("moe.aux_coef must not be negative (got %g)", moe.aux_coef);
  if (!std::isfinite(moe.z_coef) || moe.z_coef < 0) fail("moe.z_coef must not be negative (got %g)", moe.z_coef);
  if (!std::isfinite(moe.bias_rate) || moe.bias_rate < 0)
    fail("moe.bias_rate must not be negative (got %g)", moe.bias_rate);
  if (moe.shared < 0) fail("moe.shared must not be negative (got %d)", moe.shared);
}

nlohmann::json GPTConfig::to_json() const {
  nlohmann::json j = {{"vocab_size", vocab_size}, {"block_size", block_size}, {"n_layer", n_layer},
                      {"n_head", n_head}, {"n_embd", n_embd}};
  // A dense model's JSON is what it always was (checkpoints and exports of earlier runs).
  if (moe.enabled())
    j["moe"] = {{"experts", moe.experts}, {"top_k", moe.top_k}, {"every", moe.every}, {"capacity", moe.capacity},
                {"balance", moe_balance_name(moe.balance)}, {"aux_coef", moe.aux_coef}, {"z_coef", moe.z_coef},
                {"bias_rate", moe.bias_rate}, {"shared", moe.shared}};
  return j;
}

namespace {
MoeConfig moe_from_json(const nlohmann::json& j) {
  MoeConfig m;
  if (!j.is_object()) fail("model.moe must be a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    auto integer = [&] {
      if (!v.is_number_integer()) fail("model.moe.%s must be an integer", k.c_str());
      return v.get<int>();
    };
    auto number = [&] {
      if (!v.is_number()) fail("model.moe.%s must be a number", k.c_str());
      return v.get<double>();
    };
    if (k == "experts") m.experts = integer();
    else if (k == "top_k") m.top_k = integer();
    else if (k == "every") m.every = integer();
    else if (k == "shared") m.shared = integer();
    else if (k == "capacity") m.capacity = number();
    else if (k == "aux_coef") m.aux_coef = number();
    else if (k == "z_coef") m.z_coef = number();
    else if (k == "bias_rate") m.bias_rate = number();
    else if (k == "balance") {
      if (!v.is_string()) fail("model.moe.balance must be a string");
      m.balance = moe_balance_from_name(v.get<std::string>());
    } else {
      fail("unknown model key 'model.moe.%s'", k.c_str());
    }
  }
  return m;
}
}  // namespace

GPTConfig GPTConfig::from_json(const nlohmann::json& j) {
  GPTConfig c;
  if (!j.is_object()) fail("model config must be a JSON object");
  for (auto& [k, v] : j.items()) {
    if (k == "moe") {
      c.moe = moe_from_json(v);
      continue;
    }
    if (!v.is_number_integer()) fail("model.%s must be an integer", k.c_str());
    int x = v.get<int>();
    if (k == "vocab_size") c.vocab_size = x;
    else if (k == "block_size") c.block_size = x;
    else if (k == "n_layer") c.n_layer = x;
    else if (k == "n_head") c.n_head = x;
    else if (k == "n_embd") c.n_embd = x;
    else fail("unknown model key 'model.%s'", k.c_str());
  }
  c.validate();
  return c;
}

GPTConfig GPTConfig::preset(const std::string& name) {
  GPTConfig c;
  if (name == "tiny") {
    c.vocab_size = 512; c.block_size = 128; c.n_layer = 4; c.n_head = 4; c.n_embd = 128;
  } else if (name == "tiny-moe") {  // for tests: layers 1 and 3 are mixtures of 4 experts, top-2
    c = preset("tiny");
    c.moe.experts = 4; c.moe.top_k = 2; c.moe.every = 2;
  } else if (name == "gpt2") {
    c.n_layer = 12; c.n_head = 12; c.n_embd = 768;
  } else if (name == "gpt2-moe") {  // GPT-2 124M with 8 experts, top-2, in every other layer
    c = preset("gpt2");
    c.moe.experts = 8; c.moe.top_k = 2; c.moe.every = 2;
  } else if (name == "gpt2-medium") {
    c.n_layer = 24; c.n_head = 16; c.n_embd = 1024;
  } else if (name == "gpt2-large") {
    c.n_layer = 36; c.n_head = 20; c.n_embd = 1280;
  } else if (name == "gpt2-xl") {
    c.n_layer = 48; c.n_head = 25; c.n_embd = 1600;
  } else {
    fail("unknown model preset '%s' (expected tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, tiny-moe or gpt2-moe)",
         name.c_str());
  }
  return c;
}

bool GPTConfig::same_shape(const GPTConfig& o) const {
  return vocab_size == o.vocab_size && block_size == o.block_size && n_layer == o.n_layer &&
         n_head == o.n_head && n_embd == o.n_embd && moe.experts == o.moe.experts &&
         (!moe.enabled() || (moe.every == o.moe.every && moe.shared == o.moe.shared));
}

}  // namespace mt::model
