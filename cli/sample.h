// Text generation from trained weights: temperature and top-k sampling, seeded.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt::cli {

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

// The `sample` command: the flags below --model, --tokenizer, --text or --prompt, --tokens,
// --temperature, --top_k, --seed (`minitrain sample --help`); prints token ids or decoded text.
int sample_main(const std::vector<std::string>& args);

// Draws one token id from `logits` (V values): softmax at `temperature` over the top_k largest.
int32_t sample_from_logits(const float* logits, int V, float temperature, int top_k, uint64_t& rng_state);

}  // namespace mt::cli
