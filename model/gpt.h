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
// Context parallelism (parallel/ring_attention.h): a micro-batch holds this rank's T/cp zigzag rows of
// each sequence, with their positions and document ids, and the flash path's attention is ring
// attention over the cp group; everything else in a layer is per token and runs unchanged.
//
// Storage: activations and the weights forward/backward read have the store's compute dtype (fp32,
// bf16 or fp16) on both backends; the model converts each unit's fp32 compute weights into a typed
// copy when it acquires the unit. Parameter gradients are fp32.
//
// The classifier is fused with its backward and processed in row chunks: logits for a chunk are
// computed, turned into loss and dlogits in place, and pushed back through the unembedding at once,
// so the (N, Vp) logits are never materialised whole (as in llm.c's fused classifier).
//
// Stages (pipeline parallelism, parallel/pipeline_schedule.h): a GPT object holds the layers of a
// StagePlan, one or more chunks of consecutive layers, and runs one chunk at a time: stage_forward
// (micro-batch, chunk, input activation) -> a saved context, stage_backward(context, dy) -> dx. The
// first stage embeds the tokens, the last ends in the final LayerNorm and the fused classifier, so
// its forward already yields the loss and the gradient of its output; its backward starts there. The
// whole-model calls (forward_backward, forward_loss) are these stage calls composed.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "parallel/ring_attention.h"
#include "parallel/tensor_parallel.h"
#include "runtime/arena.h"
#include "runtime/param_store.h"

namespace mt::model {

// Indices of one MLP's parameters (an expert of a mixture layer) in the ParamStore.
struct MlpParams {
  int fc_w = -1, fc_b = -1, proj_w = -1, proj_b = -1;
};

// Indices of one layer's parameters in the ParamStore. A mixture-of-experts layer (GPTConfig::
// is_moe_layer) has a router and experts in place of the dense MLP (whose indices stay -1).
struct LayerParams {
  int ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1, ln2_w = -1, ln2_b = -1, fc_w = -1,
      fc_b = -1, fcproj_w = -1, fcproj_b = -1;
  int router_w = -1;                     // mlp.router.weight (E, C)
  std::vector<MlpParams> experts;        // mlp.experts.e.{c_fc,c_proj}.{weight,bias}, by global expert index;
                                         // held apart (ExpertPlacement): the expert store's, -1 if not held
  std::vector<MlpParams> shared;         // mlp.shared_experts.s.*
};

// What a mixture layer's routing did over the forwards since GPT::reset_moe_stats (a recompute's
// forward is not counted again). `balance` and `z` are sums of N x the micro-batch's value, N its
// tokens, so balance / tokens is the token-weighted mean.
struct MoeLayerStats {
  std::vector<int64_t> load;  // (E) assignments per expert, before capacity
  int64_t assignments = 0, dropped = 0, tokens = 0;
  double balance = 0, z = 0;
  // A fingerprint of every decision in order: each assignment's expert and whether it was kept. Equal
  // loads can hide two tokens trading experts (and which one a capacity drops); this cannot.
  uint64_t routing_hash = 0;
};

// One micro-batch as the model sees it: all (B,T) int32 on the host.
struct MicroBatch {
  int B = 0, T = 0;
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;    // < 0: ignored position
  const int32_t* positions = nullptr;  // nullptr: 0..T-1 in every row
  const int32_t* doc_ids = nullptr;    // nullptr: plain causal attention
};

// The layers this rank holds (the whole model by default): chunks of consecutive layers, in the order
// of their stages. With tied embeddings the first and the last stage each hold wte; under pipeline
// parallelism (first != last) the two copies are replicas over pp (kAxisPp) whose gradients the
// trainer sums, and wte is a unit of its own on both, so that their ZeRO shards line up.
struct StagePlan {
  struct Chunk {
    int begin = 0, end = 0;  // layers [begin, end)
  };
  std::vector<Chunk> chunks;
  bool first = true;  // chunk 0 is stage 0: it embeds the tokens
  bool last = true;   // the last chunk is the last stage: final LayerNorm, classifier and loss
  static StagePlan whole(int n_layer) { return StagePlan{{Chunk{0, n_layer}}, true, true}; }
};

// Expert parallelism's placement of the experts (moe/ep_exchange.h): with ranks > 1 this rank holds
// experts [rank E/ranks, (rank + 1) E/ranks) of every mixture layer it holds, and only those, in
// `store`, a second ParamStore beside the model's (one unit "h.l.experts" per mixture layer, names with
// the GLOBAL expert index), so that their gradients can be reduced over the expert-data group and
// sharded by ZeRO there, apart from the dense weights' dp x cp. ranks = 1: every expert, in the layer's
// own unit of the model's store.
struct ExpertPlacement {
  int ranks = 1, rank = 0;
  ParamStore* store = nullptr;  // required when ranks > 1
  bool apart() const { return ranks > 1; }
};

// Rows of the classifier processed at once for N rows and Vl logits a row (model/gpt_forward.cpp); the
// planner sizes the logits buffer with it.
int classifier_rows(Device device, int N, int Vl, size_t elem_bytes);

// What a stage's forward keeps for its backward (model/gpt_stage.h); opaque to callers.
class StageContext {
 public:
  virtual ~StageContext();
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
  // `plan`: the layers this rank holds (pipeline parallelism); only their parameters are registered.
  // `experts`: expert parallelism's placement (default: every expert in `store`).
  GPT(const GPTConfig& cfg, ParamStore& store, const parallel::TensorParallel& tp = parallel::TensorParallel(),
      const StagePlan& plan = StagePlan(), const ExpertPlacement& experts = ExpertPlacement());
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
  // the fp16 loss scale). Returns the SUM of the per-token losses of this micro-batch. Whole model.
  double forward_backward(const MicroBatch& mb, float dloss);
  // Forward only: the sum of per-token losses (eval). Keeps no activations. Whole model.
  double forward_loss(const MicroBatch& mb);
  // Forward only for sampling: logits (V) of the last position of row 0 written to `logits`.
  void forward_last_logits(const MicroBatch& mb, float* logits);

  // One stage. Forward of chunk `chunk` of the plan on `mb` (whose host arrays must stay valid until
  // the context is gone). `input`: the previous stage's output, stage_activation_elems() of the
  // compute dtype (empty on stage 0, which embeds the tokens; the context takes it over). train: keep
  // what backward needs (per the recompute mode) and, on the last stage, compute the loss gradient
  // with weight dloss. The last stage's loss is stage_loss() once backward (eval: forward) is done.
  std::unique_ptr<StageContext> stage_forward(int chunk, const MicroBatch& mb, Buffer input, float dloss, bool train);
  // The chunk's output activation, for the next stage (empty on the last stage); the caller takes it.
  Buffer take_stage_output(StageContext& c);
  // Backward of a training forward: accumulates the chunk's parameter gradients (reporting each
  // unit's grads_ready) and returns the gradient of its input (empty on stage 0). `dy` is the next
  // stage's gradient of this chunk's output (empty on the last stage).
  Buffer stage_backward(StageContext& c, Buffer dy);
  // zb1's split of stage_backward: B_input returns the gradient of the input (the embedding's and
  // final LayerNorm's weight gradients included) and keeps what W needs; W then makes the layers'
  // weight gradients (the same bits as stage_backward's) and frees the context's state.
  Buffer stage_backward_input(StageContext& c, Buffer dy);
  void stage_backward_weight(StageContext& c);
  double stage_loss(const StageContext& c) const;
  // Training losses left in the arena's memory: with keep set, the last stage's backward (B or B_input)
  // does not sum its per-token losses on the host (a device synchronisation per micro-batch) but keeps
  // them, N = B T f32 values, for take_stage_losses; the caller sums them once per step. Default off.
  void set_keep_stage_losses(bool keep) { keep_stage_losses_ = keep; }
  Buffer take_stage_losses(StageContext& c);
  // Elements of the activation a stage hands on (its residual stream: B T C, or B T C / tp under
  // sequence parallelism), in the compute dtype.
  int64_t stage_activation_elems(const MicroBatch& mb) const;
  const StagePlan& plan() const { return plan_; }

  void set_recompute(Recompute r) { recompute_ = r; }
  Recompute recompute() const { return recompute_; }
  void set_attention(Attention a) { attention_ = a; }
  // Context parallelism: attention runs as ring attention over `cp` (flash only; micro-batches must
  // carry their positions). Default: none.
  void set_context_parallel(const parallel::RingAttention& cp) { cp_ = cp; }
  // Expert parallelism (moe/ep_exchange.h): the mixture layers' experts are split over `ep`'s ranks
  // and the tokens travel to them by all_to_all_v. nullptr (default): every expert is local.
  // ep: the ep group (host scalars: the counts exchange); ep_data: its communicator for the rows where
  // they live (an NcclComm over the same ranks on a GPU; nullptr: ep itself).
  void set_expert_parallel(parallel::Comm* ep, parallel::Comm* ep_data = nullptr) {
    ep_ = ep;
    ep_data_ = ep_data != nullptr ? ep_data : ep;
  }
  parallel::Comm* expert_parallel() const { return ep_; }
  Attention attention() const { return attention_; }
  // Parameter units, in the order of the flat buffers: the embeddings (wte, wpe; under pipeline
  // parallelism wte alone, on the first and the last stage, and wpe as "positions" on the first),
  // each held layer, the final LayerNorm; the whole model: 0 = embeddings, 1 + l = layer l, L + 1 =
  // final LayerNorm. The model brackets every use of a unit with hooks->acquire/release within one
  // stage call and reports hooks->grads_ready(u) once backward is done with it (from the top unit
  // down; the last stage's own wte at the end of its forward, where its gradient is complete).
  // nullptr: no hooks (everything resident).
  void set_unit_hooks(UnitHooks* hooks) { hooks_ = hooks; }
  // Experts held apart (ExpertPlacement::apart): the expert store's units get their own hooks, called
  // with the layer's (acquired after it, released before it, reported ready after it).
  void set_expert_hooks(UnitHooks* hooks) { xhooks_ = hooks; }
  const ExpertPlacement& expert_placement() const { return experts_; }
  ParamStore& expert_store() const { return xstore_; }  // the model's store unless held apart
  // Layer l's unit in the expert store (-1: a dense layer, one not held, or experts not held apart).
  int expert_unit(int l) const { return expert_units_[size_t(l)]; }
  // Called with "forward" when a training forward starts and "backward" when its backward starts
  // (fault injection for recovery tests).
  void set_phase_hook(std::function<void(const char*)> hook) { phase_hook_ = std::move(hook); }
  // -1 where this rank does not hold the unit.
  int layer_unit(int l) const { return layer_units_[size_t(l)]; }
  int final_unit() const { return final_unit_; }
  int embedding_unit() const { return emb_unit_; }
  int position_unit() const { return pos_unit_; }

  // Wall time spent in forward and backward since the last reset. The classifier runs its backward
  // inside the forward (its logits are never kept); its weight and input gradient products are booked
  // to backward, where their FLOPs belong (the fused softmax's gradient stays in forward). On a device the host waits only once, for the losses after backward: there `forward` is the time
  // to queue the forward and `backward` the rest of the micro-batch.
  struct PhaseTimes {
    double forward = 0, backward = 0;
  };
  const PhaseTimes& times() const { return times_; }
  void reset_times() { times_ = PhaseTimes(); }

  // Mixture of experts (moe/). The routing statistics by layer (a dense layer's are empty).
  const std::vector<MoeLayerStats>& moe_stats() const { return moe_stats_; }
  void reset_moe_stats();
  // Layer l's routing bias (balance = bias; E zeros until updated). Not a parameter: it has no
  // gradient, the trainer updates it after each step and keeps it in checkpoints.
  std::vector<float>& moe_bias(int l) { return moe_bias_[size_t(l)]; }

  void set_arena(Arena* a) { arena_ = a; }
  void set_ctx(const ops::Ctx& c) { ctx_ = c; }
  const LayerParams& layer(int l) const { return layers_[size_t(l)]; }
  int wte() const { return wte_; }
  int wpe() const { return wpe_; }
  int lnf_w() const { return lnf_w_; }
  int lnf_b() const { return lnf_b_; }

 private:
  template <class S>
  friend class Pass;  // one stage's forward/backward in storage type S (model/gpt_pass.h)
  enum class Mode { train, eval, last_logits };
  // The whole model's pass over every chunk of a whole-model plan.
  double run(const MicroBatch& mb, float dloss, Mode mode, float* last_logits);
  std::unique_ptr<StageContext> forward_chunk(int chunk, const MicroBatch& mb, Buffer input, float dloss, Mode mode,
                                              float* last_logits);
  void check_batch(const MicroBatch& mb) const;
  void check_ready() const;

  GPTConfig cfg_;
  ParamStore& store_;
  parallel::TensorParallel tp_;
  parallel::RingAttention cp_;
  parallel::Comm* ep_ = nullptr;       // expert parallelism (nullptr: none)
  parallel::Comm* ep_data_ = nullptr;  // its rows' communicator (ep_ on the CPU)
  StagePlan plan_;
  std::vector<LayerParams> layers_;  // by global layer index (entries of layers not held are -1)
  std::vector<int> layer_units_;     // by global layer index; -1 when not held
  ExpertPlacement experts_;
  ParamStore& xstore_;               // where the experts are (store_ unless held apart)
  std::vector<int> expert_units_;    // by global layer index; -1 unless held apart
  std::vector<std::vector<float>> moe_bias_;   // by global layer index (empty: dense)
  std::vector<MoeLayerStats> moe_stats_;        // by global layer index
  int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1;
  int emb_unit_ = -1, pos_unit_ = -1, final_unit_ = -1;
  Recompute recompute_ = Recompute::none;
  bool keep_stage_losses_ = false;
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
  // Layer l's unit and, held apart, its experts' unit.
  std::vector<char> xacquired_;  // per expert-store unit (held apart)
  void acquire_layer(int l, bool grads) {
    acquire(layer_units_[size_t(l)], grads);
    const int x = expert_units_[size_t(l)];
    if (x < 0) return;
    if (xhooks_) xhooks_->acquire(x, grads);
    xacquired_[size_t(x)] = 1;
  }
  void release_layer(int l) {
    const int x = expert_units_[size_t(l)];
    if (x >= 0) {
      xacquired_[size_t(x)] = 0;
      if (xhooks_) xhooks_->release(x);
    }
    release(layer_units_[size_t(l)]);
  }
  void layer_grads_ready(int l) {
    grads_ready(layer_units_[size_t(l)]);
    const int x = expert_units_[size_t(l)];
    if (x >= 0 && xhooks_) xhooks_->grads_ready(x);
  }
  // Whether expert entry i's unit is acquired (in whichever store holds the experts).
  bool expert_acquired(int unit) const { return experts_.apart() ? xacquired_[size_t(unit)] : acquired_[size_t(unit)]; }
  UnitHooks* xhooks_ = nullptr;
  Arena* arena_ = nullptr;
  ops::Ctx ctx_;
  PhaseTimes times_;
};

}  // namespace mt::model
