// The training loop: data -> forward/backward over micro-batches (gradients reduced across
// data-parallel ranks while backward runs) -> unscale/clip -> AdamW on this rank's shard -> publish
// parameters -> metrics, with evaluation, training-state save/resume and HF export.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "config/options.h"
#include "kernels/op_timer.h"
#include "model/gpt.h"
#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/tensor_parallel.h"
#include "runtime/arena.h"
#include "runtime/dir_lock.h"
#include "runtime/param_store.h"
#include "train/batches.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/pipeline.h"

namespace mt::train {

struct StepResult {
  double loss = 0;        // mean loss of the global batch
  double grad_norm = 0;   // before clipping (unscaled)
  float lr = 0;
  bool skipped = false;   // fp16 overflow: no update
  long tokens = 0;        // tokens processed by all ranks
  double t_data = 0, t_forward = 0, t_backward = 0, t_optimizer = 0, t_total = 0;
  double t_grad_wait = 0;     // blocked on gradient reductions after backward (exposed communication;
                              // on a device, the compute stream's wait, timed by events)
  double local_grad_sq = 0;   // mean over dp ranks of |per-rank mean gradient|^2 (gradient noise scale)
  long tokens_per_rank = 0;
  // A mixture-of-experts model: the step's routing over all dp ranks (train/trainer_moe.cpp), null
  // for a dense one.
  nlohmann::json moe;
};

// Gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, appendix A): unbiased
// estimates of |G|^2 and tr(Sigma) from the gradient norms at two batch sizes, each smoothed by an
// EMA. B_small is one rank's share of the batch (the norms data parallelism already has before and
// after its reduction) or, on a single rank with gradient accumulation, the first micro-batch;
// B_big is the whole batch. Not available for ZeRO-3 (no rank ever holds its whole local gradient).
class NoiseScale {
 public:
  // Returns false while there is no estimate (a single rank, or the first steps).
  void update(double g2_small, double g2_big, double b_small, double b_big);
  bool valid() const { return count_ > 0 && g2_ > 0; }
  double b_simple() const { return s_ / g2_; }
  double g2() const { return g2_; }
  double trace_sigma() const { return s_; }

 private:
  double g2_ = 0, s_ = 0;
  int count_ = 0;
};

class Trainer {
 public:
  // Builds everything and checks every input; writes nothing. `world` is the communicator of all
  // ranks (nullptr: a one-rank world); the mesh and the data-parallel group are carved from it.
  // `local_rank` (the rank within its node; -1: the world rank) picks the GPU for --device cuda.
  explicit Trainer(const config::TrainOptions& o, parallel::Comm* world = nullptr, int local_rank = -1);
  ~Trainer();

  // The whole run: creates out_dir (refusing to overwrite another run unless resuming), writes the
  // resolved config, trains to o.steps with logs/eval/saves, then saves the final state and
  // exports <out_dir>/model.safetensors. Rank 0 writes; every rank computes. Returns 0, or
  // kExitPreempted when SIGTERM/SIGUSR1 arrived (runtime/preempt.h): the ranks agreed on it at a step
  // boundary and saved that step (resume=auto continues bitwise). A refusal before the first step
  // (out_dir taken, the lock held) throws CollectiveError with kExitRefused and leaves no file.
  int run();
  // The run's identity (run_id, drawn or resumed): in its checkpoints' metadata and its lock.
  const std::string& run_id() const { return o_.run_id; }

  StepResult step();      // one optimizer step
  double evaluate();      // mean validation loss over the first eval_batches validation batches
  int step_count() const { return step_; }

  // Checkpoints (checkpoint/): the full training state — weights, AdamW moments, step, update count,
  // loss scale, data position — each rank writing its shard, asynchronously unless ckpt.async=false.
  // Loading reads every rank's new shard by global slice, so any dp size or ZeRO stage can resume
  // any checkpoint, and under the same layout training continues bitwise identically.
  void save_checkpoint();                          // into ckpt.dir as step_<step>/ (collective)
  void wait_checkpoint();                          // until the last save is committed
  void save_state(const std::string& root);        // a synchronous checkpoint under `root`
  // `path`: a checkpoint (step_N/) or a root whose newest valid checkpoint is taken. Collective.
  void load_state(const std::string& path);
  const std::string& checkpoint_dir() const { return ckpt_opts_.dir; }
  // Master weights in the store's full layout (total_numel), gathered from the shards (tp = 1).
  std::vector<float> full_master();
  // Every parameter's whole tensor (global shape, row-major), in entry order, gathered over dp and tp
  // onto every rank: the weights as a single-rank run holds them, under any layout; under pipeline or
  // expert parallelism in the whole model's entry order (the one-rank model's). Collective.
  std::vector<std::vector<float>> global_master();
  // The same for the last step's reduced gradients (as the optimizer read them: unscaled, clipped
  // when optim.grad_clip clipped them). Collective.
  std::vector<std::vector<float>> global_grads();

  model::GPT& model() { return *gpt_; }
  ParamStore& params() { return store_; }
  // Expert parallelism (--ep > 1, a mixture model): this rank's routed experts, in a store of their own
  // (model::ExpertPlacement) whose gradients are reduced and ZeRO-sharded over the expert-data group
  // (parallel/mesh.h); nullptr for expert_data_parallel() when the experts are not held apart (or this
  // pipeline stage holds no mixture layer).
  ParamStore& expert_params() { return expert_store_; }
  parallel::DataParallel* expert_data_parallel() { return expert_dp_.get(); }
  Arena& arena() { return arena_; }
  const config::TrainOptions& options() const { return o_; }
  parallel::Mesh& mesh() { return *mesh_; }
  // What a group's ranks exchanged since the step began (its host communicator and, on GPUs, the
  // NCCL one beside it): the dp and tp groups so far; under context parallelism `dp` is the cp x dp
  // group the gradients are reduced over, and `cp` the ring attention's traffic.
  parallel::CommCounters group_counters(parallel::MeshDim d) const;
  // The ep group's since the step began: the mixture layers' token all-to-alls (zero without --ep).
  parallel::CommCounters ep_counters() const;
  // Every communicator this rank holds, the mesh's host ones and the device ones beside them: the one
  // list that counter resets and trace lanes walk.
  std::vector<parallel::Comm*> comms() const;
  parallel::DataParallel& data_parallel() { return *dp_; }
  const NoiseScale& noise_scale() const { return gns_; }
  const LossScaler& loss_scaler() const { return scaler_; }
  ops::OpTimer* op_timer() { return op_timer_.get(); }  // with profile_ops=1, else nullptr
  // trace=1: this rank's Chrome trace to <dir>/rank_NNNNN.json (every rank writes its own; run()
  // writes <out_dir>/trace/ after the last step).
  void write_trace(const std::string& dir);
  // For tests: called on each micro-batch (its index in the step, the batch) right after it is read,
  // before its targets are counted, e.g. to ignore some targets (-1).
  void set_batch_hook(std::function<void(size_t, HostBatch&)> hook) { batch_hook_ = std::move(hook); }

 private:
  void check_replicas();  // silent-data-corruption check across dp (x cp) replicas
  // The ranks holding replicas of this rank's parameters: the dp group, or the cp x dp group under
  // context parallelism (gradients, loss, token counts and ZeRO shards are over it).
  parallel::Comm& replicas() const { return mesh_->cp() > 1 ? mesh_->cp_dp_comm() : mesh_->dp_comm(); }
  // Their group's name, whose device communicator (on a GPU) carries the gradients' collectives.
  parallel::MeshGroup replica_group() const {
    return mesh_->cp() > 1 ? parallel::MeshGroup::cp_dp : parallel::MeshGroup::dp;
  }
  // Whole tensors of vectors in the optimizer's shard layouts (master weights or gradients: `shard` of
  // the model's store, `expert_shard` of the expert store).
  std::vector<std::vector<float>> global_tensors(const float* shard, const float* expert_shard);
  // The experts held apart over the ep group: the gradient's sum of squares and finiteness over every
  // expert once (train/trainer_experts.cpp). Collective over the expert-data and ep groups; 0 / true
  // when the experts are not held apart.
  double expert_grad_sum_squares();
  bool expert_grads_finite();
  // Whether --ep holds the routed experts apart (the same answer on every rank).
  bool experts_held_apart() const;
  // Whether group g gets a device (NCCL) communicator: parallel::device_comm_size, the rule the planner
  // counts by too. `experts_apart`: this rank's stage holds experts apart (for expert_data).
  bool device_comm(parallel::MeshGroup g, bool experts_apart = false) const;
  // The replica check of one store's compute parameters across `group` (its world ranks in order).
  void check_replicas_of(const ParamStore& store, parallel::Comm& group, const std::vector<int>& ranks, bool flip);
  // The expert store's counted entries (a replica over tp on tp rank 0 only).
  std::vector<char> expert_counted_entries() const;
  // Builds the expert store's data parallelism, its hooks and optimizer (after init_weights).
  void build_expert_state(const parallel::DataParallelOptions& dense);
  // After a step of a mixture-of-experts model: sums the routing statistics over dp, updates the
  // routing bias (balance = bias) and returns the step's routing metrics (train/trainer_moe.cpp).
  nlohmann::json finish_moe_step();
  // The routing biases for a checkpoint's metadata, and back (absent: zero, as a fresh run starts).
  nlohmann::json moe_bias_json();
  void restore_moe_bias(const nlohmann::json& meta, const std::string& ckpt_path);
  void reset_group_counters();
  // Per entry: whether this rank counts it in norms (every split entry; a tp replica on tp rank 0; the
  // last stage's copy of the tied wte, a replica over pp, not at all).
  std::vector<char> counted_entries() const;
  // Collective: throws DivergenceError (train/divergence.h) if the state a save would write is not finite.
  void check_state_finite();
  checkpoint::SaveRequest checkpoint_request();
  void load_checkpoint(const std::string& ckpt_path);
  // Where the run starts, as o.resume says (train/trainer_resume.cpp): the checkpoint to load, or ""
  // for step 0. Collective.
  std::string choose_resume();
  // Resuming under another dp size without global_batch: keeps the checkpoint's global batch (as if
  // global_batch were given), saying so. Before the batch is sized.
  void keep_saved_global_batch(const std::string& ckpt_path);
  // On load: what a change of precision since the save means for the loss scale, said once.
  void restore_loss_scale(const nlohmann::json& meta, const std::string& ckpt_path);
  // One run per directory (runtime/dir_lock.h): rank 0 locks out_dir and the checkpoint directory
  // (creating them when `create`; else only those that exist) unless held already; if another run
  // holds one, every rank fails together, rank 0 naming the holder. Collective.
  void lock_run_dirs(bool create);
  // Chooses the run's identity once the start point is known: run_id as given, else the resumed
  // checkpoint's, else one drawn by rank 0 (the same on every rank). Collective.
  void settle_run_id(const std::string& resumed_run_id);
  // Whether any rank has received a preemption signal (one max-reduction over the world: the signal
  // number, 0 when none). Collective, at a step boundary.
  int agreed_preemption();
  // On load: one line naming the options that changed since the checkpoint was saved.
  void report_changes(const nlohmann::json& meta, const std::string& ckpt_path);
  // Fault injection (train/fault_plan.cpp): fails if the planned fault could never fire (before
  // anything is written), arms it (once per out_dir); at the end of the run, fails if it was armed
  // and never fired.
  void check_fault_plan();
  void arm_fault_injection();
  void check_fault_fired();
  // Waits on peers (train/stragglers.cpp): dist.timeout on the world and every communicator split
  // from it, whose expiry writes <out_dir>/flight_recorder.rank<R>.jsonl (returns what it says of it);
  // the seconds this rank has been blocked on peers over all its communicators; every rank's busy
  // seconds of a step (collective over the world); the hang and straggler faults before a step.
  void install_wait_policy();
  std::string write_flight_records() const;
  double blocked_seconds() const;
  std::vector<double> gather_busy(double busy_s);
  void delay_faults();
  // With one rank, the noise scale compares the first micro-batch's gradient with the whole batch's.
  // (Not under tensor or context parallelism: there the first micro-batch's gradients are still partial
  // sums over tp or cp.)
  bool noise_scale_from_micro() const {
    return mesh_->dp_comm().size() == 1 && micro_.size() > 1 && store_.full_grads() && !tp_.active() &&
           mesh_->pp() == 1 && mesh_->cp() == 1;
  }
  void update_noise_scale(StepResult& r, double first_sum_sq, double inv_scale, int32_t valid, int32_t valid_local);
  // The entries both noise-scale norms cover: counted_entries() less the pipeline's tied copies.
  std::vector<char> noise_scale_entries() const;
  void fault(const char* phase) {
    checkpoint::fault_point(ckpt_opts_, world_.rank(), step_ + 1, phase);
    if (ckpt_opts_.fault_phase == "preempt") preempt_fault(phase);
  }
  // ckpt.fault_phase=preempt: rank fault_rank sends itself SIGTERM in the forward pass of fault_step,
  // as a batch system would (train/trainer_run.cpp).
  void preempt_fault(const char* phase);

  config::TrainOptions o_;
  std::unique_ptr<Trace> trace_;            // trace=1; before everything that points at it
  std::unique_ptr<ops::OpTimer> op_timer_;  // before everything holding a Ctx that points at it
  std::unique_ptr<ops::Regions> regions_;   // profile or trace: the step's host work, named
  std::unique_ptr<ops::OpTimer> grad_wait_timer_;  // device runs: the compute stream's wait for reductions
  std::unique_ptr<parallel::Comm> own_world_;
  parallel::Comm& world_;
  Arena arena_;  // before mesh_: the communicators return their buffers to it when destroyed
  std::unique_ptr<parallel::Mesh> mesh_;  // the groups' communicators, host and device (NCCL)
  ParamStore store_;
  ParamStore expert_store_;  // --ep: this rank's routed experts (empty otherwise)
  std::unique_ptr<model::GPT> gpt_;
  std::unique_ptr<parallel::DataParallel> dp_;
  std::unique_ptr<parallel::DataParallel> expert_dp_;        // the experts over the expert-data group
  std::unique_ptr<parallel::TensorParallelGrads> expert_tp_grads_;
  parallel::TensorParallel tp_;                           // this rank's tp group (size 1: none)
  std::unique_ptr<parallel::TensorParallelGrads> tp_grads_;  // the model's hooks when tp > 1
  std::unique_ptr<Pipeline> pipeline_;                       // pp > 1: the step runs the schedule
  std::unique_ptr<AdamW> adam_;
  std::unique_ptr<AdamW> expert_adam_;  // the experts' moments (expert_dp_'s shard)
  checkpoint::Options ckpt_opts_;
  std::string resume_path_;  // the checkpoint the run started from ("" : step 0)
  DirLock out_lock_, ckpt_lock_;  // held by rank 0 from the start of the run (resume=auto: of the scan)
  std::vector<std::string> created_dirs_;  // by lock_run_dirs on rank 0: removed again if the lock is refused
  std::unique_ptr<checkpoint::Checkpointer> ckpt_;
  LossScaler scaler_;
  NoiseScale gns_;
  std::unique_ptr<BatchSource> train_data_, val_data_;
  std::vector<HostBatch> micro_;
  std::function<void(size_t, HostBatch&)> batch_hook_;
  // Device scalars of a step, so the host need not wait inside it: the gradient's sum of squares,
  // the first micro-batch's (noise scale, one rank) and the unscale-and-clip factor.
  struct StepScalars {
    double sum_sq, first_sum_sq;
    float coef;
  };
  Buffer step_scalars_;
  StepScalars* scalars() const { return static_cast<StepScalars*>(step_scalars_.data()); }
  ops::Ctx ctx_;
  double expert_sq_ = 0;  // the last step's expert gradient sum of squares over ep (scaled, tp-partial)
  int step_ = 0;     // optimizer steps taken (including fp16-skipped ones)
  int updates_ = 0;  // AdamW updates applied (the bias-correction count)
};

}  // namespace mt::train

namespace mt::train {
// The peak the run's MFU is measured against: peak_flops when given, else on the CUDA backend the
// datasheet peak of the current GPU (fails for a GPU not in the table, naming peak_flops), else the
// CPU calibration GEMM, `seconds` of it (a run: kPeakSeconds). The label says which.
plan::Peak run_peak(const config::TrainOptions& o, int threads, double seconds);
// True where run_peak measures the peak (the CPU calibration) instead of taking a given or datasheet
// figure: what decides whether a run (or bench) reads it again.
bool peak_is_measured(const config::TrainOptions& o);
// How long a CPU run reads its peak, before the steps and, once the run has lasted kRereadAfterSeconds
// (so that the reading costs it under 1%), again at the end, every rank at once; the summary keeps the
// faster. One reading can fall in a slow phase of a shared machine, which would make MFU read high.
constexpr double kPeakSeconds = 0.3;
constexpr double kRereadAfterSeconds = 30;
// Consolidates a checkpoint (any layout) into one safetensors file with Hugging Face GPT-2 names and
// orientation; with `all`, also every AdamW moment under its checkpoint name (for bitwise comparisons).
void export_checkpoint(const std::string& ckpt_path, const std::string& out_path, bool all);
}  // namespace mt::train
