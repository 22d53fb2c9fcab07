#include "model/config.h"

#include "runtime/check.h"

namespace mt::model {

int64_t GPTConfig::num_params() const {
  int64_t C = n_embd, L = n_layer;
  int64_t per_layer = 2 * C            // ln_1
                      + C * 3 * C + 3 * C  // c_attn
                      + C * C + C      // attn c_proj
                      + 2 * C          // ln_2
                      + C * 4 * C + 4 * C  // c_fc
                      + 4 * C * C + C; // mlp c_proj
  return int64_t(vocab_size) * C + int64_t(block_size) * C + L * per_layer + 2 * C;
}

int64_t GPTConfig::num_matmul_params() const {
  int64_t C = n_embd;
  return int64_t(n_layer) * 12 * C * C + int64_t(vocab_size) * C;
}

double GPTConfig::flops_per_token(int T) const {
  return 6.0 * double(num_matmul_params()) + 12.0 * n_layer * double(n_embd) * T;
}

void GPTConfig::validate() const {
  if (vocab_size <= 0) fail("model.vocab_size must be positive (got %d)", vocab_size);
  if (block_size <= 0) fail("model.block_size must be positive (got %d)", block_size);
  if (n_layer <= 0) fail("model.n_layer must be positive (got %d)", n_layer);
  if (n_head <= 0) fail("model.n_head must be positive (got %d)", n_head);
  if (n_embd <= 0) fail("model.n_embd must be positive (got %d)", n_embd);
  if (n_embd % n_head != 0)
    fail("model.n_embd (%d) must be divisible by model.n_head (%d)", n_embd, n_head);
}

nlohmann::json GPTConfig::to_json() const {
  return {{"vocab_size", vocab_size}, {"block_size", block_size}, {"n_layer", n_layer},
          {"n_head", n_head}, {"n_embd", n_embd}};
}

GPTConfig GPTConfig::from_json(const nlohmann::json& j) {
  GPTConfig c;
  if (!j.is_object()) fail("model config must be a JSON object");
  for (auto& [k, v] : j.items()) {
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
  } else if (name == "gpt2") {
    c.n_layer = 12; c.n_head = 12; c.n_embd = 768;
  } else if (name == "gpt2-medium") {
    c.n_layer = 24; c.n_head = 16; c.n_embd = 1024;
  } else if (name == "gpt2-large") {
    c.n_layer = 36; c.n_head = 20; c.n_embd = 1280;
  } else if (name == "gpt2-xl") {
    c.n_layer = 48; c.n_head = 25; c.n_embd = 1600;
  } else {
    fail("unknown model preset '%s' (expected tiny, gpt2, gpt2-medium, gpt2-large or gpt2-xl)", name.c_str());
  }
  return c;
}

bool GPTConfig::same_shape(const GPTConfig& o) const {
  return vocab_size == o.vocab_size && block_size == o.block_size && n_layer == o.n_layer &&
         n_head == o.n_head && n_embd == o.n_embd;
}

}  // namespace mt::model
