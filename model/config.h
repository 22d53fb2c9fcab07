// GPT-2 model configuration: presets, free dimensions, validation, JSON form.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/tensor.h"

namespace mt::model {

enum class Recompute { none, selective, full };
Recompute recompute_from_name(const std::string& s);  // throws naming --recompute
const char* recompute_name(Recompute r);
enum class Attention { materialized, flash };
Attention attention_from_name(const std::string& s);  // throws naming --attention
const char* attention_name(Attention a);

// How a mixture-of-experts layer keeps its experts busy (moe/router.h): `aux` adds the Switch
// Transformer load-balancing loss to the objective, `bias` adjusts a per-expert routing bias after
// every step (DeepSeek-V3's auxiliary-loss-free balancing), `none` does neither.
enum class MoeBalance { aux, bias, none };
MoeBalance moe_balance_from_name(const std::string& s);  // throws naming moe.balance
const char* moe_balance_name(MoeBalance b);

// Mixture of experts (moe/): every `every`-th layer's MLP (layers every-1, 2 every-1, ...) is a router
// and `experts` GPT-2 MLPs of which each token uses `top_k`, plus `shared` MLPs every token uses.
// experts = 0: a dense model.
struct MoeConfig {
  int experts = 0;
  int top_k = 2;
  int every = 1;
  double capacity = 0;  // capacity factor: an expert takes ceil(capacity N top_k / experts) of N tokens; 0: dropless
  MoeBalance balance = MoeBalance::aux;
  double aux_coef = 1e-2;   // alpha of the load-balancing loss alpha E sum_i f_i P_i
  double z_coef = 1e-3;     // router z-loss weight (ST-MoE, Zoph et al. 2022)
  double bias_rate = 1e-3;  // gamma of the bias update (balance = bias)
  int shared = 0;           // shared experts, applied to every token

  bool enabled() const { return experts > 0; }
  bool operator==(const MoeConfig&) const = default;
};

struct GPTConfig {
  int vocab_size = 50257;  // real vocabulary; the embedding is padded to padded_vocab()
  int block_size = 1024;   // maximum sequence length (learned positions)
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  MoeConfig moe;

  // Vocabulary padded to a multiple of 128 so the classifier GEMM has friendly shapes; the padded
  // rows are zero, never predicted and excluded from the loss.
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  int head_dim() const { return n_embd / n_head; }
  // Whether layer l's MLP is a mixture of experts.
  bool is_moe_layer(int l) const { return moe.enabled() && (l + 1) % moe.every == 0; }
  int num_moe_layers() const;
  // Parameter count (unpadded vocabulary, tied embedding counted once), as Hugging Face reports it;
  // every expert counted.
  int64_t num_params() const;
  // The parameters one token uses: a mixture layer's router, its top_k experts and its shared ones
  // (equal to num_params() for a dense model).
  int64_t num_active_params() const;
  // Parameters used in matrix products per token: the four block matrices per layer (a mixture
  // layer: its router and the MLPs of top_k + shared experts) plus the tied unembedding once
  // (DESIGN.md: lookups, norms and biases excluded).
  int64_t num_matmul_params() const;
  // num_matmul_params() without the unembedding: what a full recompute runs again.
  int64_t layer_matmul_params() const;
  // Training FLOPs per token at sequence length T: 6 N_matmul + 12 L C T (PaLM, appendix B).
  double flops_per_token(int T) const;

  // Throws mt::Error naming the offending field (sizes, n_embd % n_head, moe.top_k > moe.experts ...).
  void validate() const;
  nlohmann::json to_json() const;
  static GPTConfig from_json(const nlohmann::json& j);  // unknown keys are errors
  // tiny | gpt2 | gpt2-medium | gpt2-large | gpt2-xl | tiny-moe | gpt2-moe
  static GPTConfig preset(const std::string& name);
  bool same_shape(const GPTConfig& o) const;
};

// FLOPs per token for HFU: the model FLOPs plus what activation recomputation runs again. Full
// recompute re-runs each layer's forward (2 N_layers + 4 L C T), selective re-runs the attention core
// (4 L C T), and the flash backward recomputes one (CPU) or three (GPU) of the attention products
// (2 L C T each). Attention is counted as the model FLOPs count it, the whole T x T, although a causal
// kernel skips the blocks above the diagonal and executes about half of it: the same convention as
// the planner's attention rates and `bench --calibrate`, so their times stay consistent.
double hardware_flops_per_token(const GPTConfig& cfg, int T, Recompute r,
                                Attention a = Attention::materialized, Device device = Device::cpu);
// The attention products' share of it (12 L C T without recompute): the part the planner times at the
// attention kernels' rate rather than the GEMMs'.
double attention_flops_per_token(const GPTConfig& cfg, int T, Recompute r, Attention a,
                                 Device device);

}  // namespace mt::model
