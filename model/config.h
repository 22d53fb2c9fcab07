// GPT-2 model configuration: presets, free dimensions, validation, JSON form.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace mt::model {

struct GPTConfig {
  int vocab_size = 50257;  // real vocabulary; the embedding is padded to padded_vocab()
  int block_size = 1024;   // maximum sequence length (learned positions)
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;

  // Vocabulary padded to a multiple of 128 so the classifier GEMM has friendly shapes; the padded
  // rows are zero, never predicted and excluded from the loss.
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  int head_dim() const { return n_embd / n_head; }
  // Parameter count (unpadded vocabulary, tied embedding counted once), as Hugging Face reports it.
  int64_t num_params() const;
  // Parameters used in matrix products per token: the four block matrices per layer plus the tied
  // unembedding once (DESIGN.md: lookups, norms and biases excluded).
  int64_t num_matmul_params() const;
  // Training FLOPs per token at sequence length T: 6 N_matmul + 12 L C T (PaLM, appendix B).
  double flops_per_token(int T) const;

  // Throws mt::Error naming the offending field (sizes, n_embd % n_head, ...).
  void validate() const;
  nlohmann::json to_json() const;
  static GPTConfig from_json(const nlohmann::json& j);  // unknown keys are errors
  // tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl
  static GPTConfig preset(const std::string& name);
  bool same_shape(const GPTConfig& o) const;
};

}  // namespace mt::model
