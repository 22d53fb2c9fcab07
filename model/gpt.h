// GPT-2: pre-LN transformer, learned positions, 4x GELU MLP, tied embedding/unembedding, vocabulary
// padded to a multiple of 128. Forward and backward are explicit (no autograd): backward is a
// reverse loop over the layers reading the activations saved by forward, or recomputing them.
//
// Activation checkpointing (Recompute):
//   none       every layer keeps all its activations until backward;
//   selective  the attention probabilities (B,NH,T,T) are not kept; backward recomputes them from
//              the saved qkv (Korthikanti et al. 2022, "Reducing Activation Recomputation");
//   full       only each layer's input (N,C) is kept; backward re-runs the layer's forward first.
// Activations come from the Arena under MemCategory::activations, so the saving is measured.
//
// Attention (Attention): `materialized` keeps the (B,NH,T,T) probabilities (subject to Recompute);
// `flash` never forms them: an online-softmax kernel keeps only each query's log-sum-exp and backward
// recomputes the probabilities tile by tile (Dao et al. 2022), so selective recompute is implied.
//
// Storage: activations and the weights forward/backward read have the store's compute dtype (fp32,
// bf16 or fp16) on both backends; the model converts each unit's fp32 compute weights into a typed
// copy when it acquires the unit. Parameter gradients are fp32.
//
// The classifier is fused with its backward and processed in row chunks: logits for a chunk are
// computed, turned into loss and dlogits in place, and pushed back through the unembedding at once,
// so the (N, Vp) logits are never materialised whole (as in llm.c's fused classifier).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "parallel/tensor_parallel.h"
#include "runtime/arena.h"
#include "runtime/param_store.h"

namespace mt::model {

enum class Recompute { none, selective, full };
Recompute recompute_from_name(const std::string& s);  // throws naming --recompute
const char* recompute_name(Recompute r);
enum class Attention { materialized, flash };
Attention attention_from_name(const std::string& s);  // throws naming --attention
const char* attention_name(Attention a);

// Indices of one layer's parameters in the ParamStore.
struct LayerParams {
  int ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};

// One micro-batch as the model sees it: all (B,T) int32 on the host.
struct MicroBatch {
  int B = 0, T = 0;
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;    // < 0: ignored position
  const int32_t* positions = nullptr;  // nullptr: 0..T-1 in every row
  const int32_t* doc_ids = nullptr;    // nullptr: plain causal attention
};

template <class S>
class Pass;

class GPT {
 public:
  // Registers the parameters in `store` (which the caller finalizes). Names follow Hugging Face's
  // GPT-2 ("transformer.h.0.attn.c_attn.weight"); matrices are stored (out, in) like nn.Linear.
  // With tensor parallelism (parallel/tensor_parallel.h) the store holds this rank's part of each
  // split matrix, each entry's box saying which; the caller checks the layout rules first
  // (check_tensor_parallel).
  GPT(const GPTConfig& cfg, ParamStore& store, const parallel::TensorParallel& tp = parallel::TensorParallel());
  // Fails, naming --tp and the numbers, unless `cfg` splits evenly over tp ranks: heads, 4 C and the
  // padded vocabulary divisible by tp.
  static void check_tensor_parallel(const GPTConfig& cfg, int tp);

  const GPTConfig& config() const { return cfg_; }
  // GPT-2 initialisation: N(0, 0.02) matrices and embeddings, residual projections scaled by
  // 1/sqrt(2 L) (Radford et al. 2019), zero biases, unit LayerNorm gains. Writes master weights.
  // Every rank draws the whole tensors and keeps its box, so any layout starts from the same model.
  void init_weights(uint64_t seed);

  // Forward + backward of one micro-batch. Parameter gradients are accumulated (+=) into the store's
  // grads with every token's loss weighted by `dloss` (1 / valid tokens of the global batch, times
  // the fp16 loss scale). Returns the SUM of the per-token losses of this micro-batch.
  double forward_backward(const MicroBatch& mb, float dloss);
  // Forward only: the sum of per-token losses (eval). Keeps no activations.
  double forward_loss(const MicroBatch& mb);
  // Forward only for sampling: logits (V) of the last position of row 0 written to `logits`.
  void forward_last_logits(const MicroBatch& mb, float* logits);

  void set_recompute(Recompute r) { recompute_ = r; }
  Recompute recompute() const { return recompute_; }
  void set_attention(Attention a) { attention_ = a; }
  Attention attention() const { return attention_; }
  // Parameter units: 0 = embeddings (wte, wpe), 1 + l = layer l, L + 1 = final LayerNorm. The model
  // brackets every use of a unit with hooks->acquire/release and reports hooks->grads_ready(u) once
  // backward is done with it (order: L+1, L, ..., 1, 0). nullptr: no hooks (everything resident).
  void set_unit_hooks(UnitHooks* hooks) { hooks_ = hooks; }
  // Called with "forward" when a training forward starts and "backward" when its backward starts
  // (fault injection for recovery tests).
  void set_phase_hook(std::function<void(const char*)> hook) { phase_hook_ = std::move(hook); }
  static int layer_unit(int l) { return 1 + l; }
  int final_unit() const { return cfg_.n_layer + 1; }

  // Wall time spent in forward (including the fused classifier) and backward since the last reset.
  // On a device the host waits only once, for the losses after backward: there `forward` is the time
  // to queue the forward and `backward` the rest of the micro-batch.
  struct PhaseTimes {
    double forward = 0, backward = 0;
  };
  const PhaseTimes& times() const { return times_; }
  void reset_times() { times_ = PhaseTimes(); }

  void set_arena(Arena* a) { arena_ = a; }
  void set_ctx(const ops::Ctx& c) { ctx_ = c; }
  const LayerParams& layer(int l) const { return layers_[size_t(l)]; }
  int wte() const { return wte_; }
  int wpe() const { return wpe_; }
  int lnf_w() const { return lnf_w_; }
  int lnf_b() const { return lnf_b_; }

 private:
  template <class S>
  friend class Pass;  // one forward/backward in storage type S (model/gpt_forward.cpp)
  enum class Mode { train, eval, last_logits };
  double run(const MicroBatch& mb, float dloss, Mode mode, float* last_logits);
  void check_batch(const MicroBatch& mb) const;

  GPTConfig cfg_;
  ParamStore& store_;
  parallel::TensorParallel tp_;
  std::vector<LayerParams> layers_;
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  Recompute recompute_ = Recompute::none;
  Attention attention_ = Attention::materialized;
  // Per unit: whether it is acquired (a weight read outside acquire/release fails in every precision).
  std::vector<char> acquired_;
  UnitHooks* hooks_ = nullptr;
  std::function<void(const char*)> phase_hook_;
  void acquire(int u, bool grads) {
    if (hooks_) hooks_->acquire(u, grads);
    acquired_[size_t(u)] = 1;
  }
  void release(int u) {
    acquired_[size_t(u)] = 0;
    if (hooks_) hooks_->release(u);
  }
  void grads_ready(int u) {
    if (hooks_) hooks_->grads_ready(u);
  }
  Arena* arena_ = nullptr;
  ops::Ctx ctx_;
  PhaseTimes times_;
};

}  // namespace mt::model
