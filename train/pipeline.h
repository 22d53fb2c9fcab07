// Pipeline parallelism in the trainer (--pp): which layers each pipeline rank holds, the step's
// micro-batches through the schedule's executor (parallel/pipeline_executor.h) over the model's stage
// calls, evaluation through the stages, and the tied embedding's gradient summed over its two copies.
//
// Who holds what. The n_layer layers are cut into S = pp x pp.virtual stages, as pp.layers lists them,
// evenly under interleaved, or else balanced by FLOPs (the last stage also runs the classifier, which
// for GPT-2's vocabulary costs about 4.5 of gpt2's layers at T = 1024); rank r holds stages
// chunk x pp + r. Stage 0 holds wte and wpe, the last stage ln_f and its own copy of wte (tied
// embeddings).
//
// Loss. Every pp rank of a data-parallel replica reads the same micro-batches; each micro-batch's
// loss is weighted by the whole step's 1 / valid tokens (the trainer's dloss), computed by the last
// stage only, and the step's loss is summed there in micro-batch order, as a single rank sums it.
//
// Tied embeddings. The first and the last stage each accumulate a gradient for wte (the embedding's
// and the classifier's); after the data-parallel reduction the two ranks exchange their parts (the
// same ZeRO shard layout: wte is a unit of its own on both) and each adds the other's, so both copies
// get the same sum and stay bitwise equal (x + y = y + x in IEEE arithmetic). Norms count the copy
// of pp rank 0 only (ParamEntry::replicated has kAxisPp), and a checkpoint stores it once.
// Bytes: the wte gradient (Vp C / (tp dp) fp32 elements under ZeRO 1-3, Vp C / tp under ZeRO-0)
// each way per step between pp ranks 0 and pp - 1.
//
// Where things live. Messages, the received half of the tied gradient and the last stage's per-token
// losses are arena memory (the GPU's on --device cuda) and travel over the message communicator: the
// pp group's host communicator on the CPU, an NCCL communicator of the same ranks on GPUs (the
// executor then pairs each step's sends and receives, parallel/pipeline_exchange.h). The host sees
// one thing per step: the losses, downloaded once by loss_sum() after the step's reductions are
// queued; the few scalars summed over pp (loss, norms, bubble figures) go over the host communicator.
#pragma once
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/options.h"
#include "model/gpt.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline_executor.h"
#include "train/batches.h"

namespace mt::train {

class Pipeline final : public parallel::PipelineStages {
 public:
  // `pp`: the pipeline group's host communicator (scalars); `messages`: the communicator activations,
  // gradients and the tied gradient travel over, in the arena's memory (`pp` itself on the CPU, an
  // NcclComm over the same ranks on GPUs). `ctx`: the run's device and stream.
  Pipeline(const config::TrainOptions& o, parallel::Comm& pp, parallel::Comm& messages, model::GPT& gpt, ParamStore& store,
           parallel::DataParallel& dp, Arena& arena, const ops::Ctx& ctx);

  // One step's forward and backward of `micro` through the schedule. Gradients are reduced over dp as
  // units complete; call DataParallel::finish_grads, sum_tied_grads, then loss_sum.
  void step(const std::vector<HostBatch>& micro, float dloss);
  // The step's sum of per-token losses on the last stage (0 elsewhere): downloaded from the arena
  // (waiting for the device there) and summed per micro-batch in token order, then over the
  // micro-batches in order, as a single rank sums them.
  double loss_sum();
  // Forward only of one batch through every stage: the loss sum on the last stage, 0 elsewhere.
  double forward_loss(const HostBatch& b);
  // After finish_grads: the two copies of wte's gradient summed (first and last stage; no-op elsewhere).
  void sum_tied_grads();
  // Expert parallelism's second data parallelism (the experts held apart): told each micro-batch's
  // last-ness alongside the dense one.
  void set_expert_data_parallel(parallel::DataParallel* x) { xdp_ = x; }
  const parallel::PipelineStats& stats() { return exec_.stats(); }
  void set_trace(Trace* trace) { exec_.set_trace(trace); }
  // Device timers for the executor's figures (parallel/pipeline_executor.h): a GPU run's bubble.
  void set_timers(std::unique_ptr<ops::OpTimer> span, std::unique_ptr<ops::OpTimer> compute) {
    exec_.set_timers(std::move(span), std::move(compute));
  }
  // The last step's measured figures of every rank of this pipeline, as metrics.jsonl logs them
  // under "pp": idle_s (per pp rank: the longest rank's run of the schedule, the step's pipeline
  // phase, less the rank's time in F and B), bubble_ranks (idle_s over that phase, each in [0, 1)),
  // bubble (their mean: the simulator's bubble_fraction, measured), forward_s and backward_s (the
  // mean F and B of one chunk on one micro-batch, over the ranks). Collective over pp (one small
  // all-gather).
  nlohmann::json step_json();

  // parallel::PipelineStages
  size_t message_elems() const override { return elems_; }
  DType message_dtype() const override { return store_.compute_dtype(); }
  Buffer alloc_message() override;
  void before(const parallel::Action& a, bool last) override;
  Buffer forward(int chunk, int micro, Buffer input) override;
  Buffer backward(int chunk, int micro, Buffer dy) override;
  Buffer backward_input(int chunk, int micro, Buffer dy) override;
  void backward_weight(int chunk, int micro) override;

 private:
  parallel::Comm& pp_;
  parallel::Comm& msg_;
  model::GPT& gpt_;
  ParamStore& store_;
  parallel::DataParallel& dp_;
  parallel::DataParallel* xdp_ = nullptr;
  Arena& arena_;
  ops::Ctx ctx_;
  parallel::PipelineExecutor exec_;
  // The step in progress.
  const std::vector<HostBatch>* micro_ = nullptr;
  float dloss_ = 0;
  size_t elems_ = 0;
  // (chunk, micro): from F until B (zb1: until W)
  std::map<std::pair<int, int>, std::unique_ptr<model::StageContext>> contexts_;
  model::StageContext& context(int chunk, int micro, const char* action);
  Buffer backward_input_or_whole(int chunk, int micro, Buffer dy, bool split);
  Buffer losses_;                 // the last stage's per-token losses, micro-batch after micro-batch
  size_t loss_bytes_ = 0;         // of one micro-batch
  std::vector<char> loss_taken_;  // per micro-batch
};

}  // namespace mt::train
