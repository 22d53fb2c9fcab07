// Text generation from trained weights: temperature and top-k sampling, seeded.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt::train {

struct SampleOptions {
  std::string model_path;      // model.safetensors written by a run (or any HF GPT-2 file + dims)
  std::vector<int32_t> prompt; // token ids; empty: start from token 0... the caller supplies EOT
  int max_new_tokens = 64;
  float temperature = 1.0f;    // 0: greedy
  int top_k = 40;              // 0: no truncation
  uint64_t seed = 1;
  int32_t stop_token = -1;     // generation ends after this token is produced (the end-of-text token)
  int vocab_limit = 0;         // > 0: draw only ids below it (a tokenizer's vocabulary, when the model's is larger)
};

// Returns prompt + generated tokens. The model config comes from the file's metadata.
std::vector<int32_t> sample_tokens(const SampleOptions& o);

// Draws one token id from `logits` (V values): softmax at `temperature` over the top_k largest.
int32_t sample_from_logits(const float* logits, int V, float temperature, int top_k, uint64_t& rng_state);

}  // namespace mt::train
