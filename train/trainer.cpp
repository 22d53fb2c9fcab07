#include "train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>

#include "config/layout_rules.h"
#include "kernels/cuda_available.h"
#include "model/hf_io.h"
#include "parallel/launch.h"
#ifdef MT_HAVE_NCCL
#endif
#include "parallel/self_comm.h"
#include "runtime/check.h"
#include "runtime/exit_status.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/snapshot_copy.h"
#endif

namespace mt::train {

using clock_type = std::chrono::steady_clock;

static double since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// The memory the run's arena allocates from: the GPU's for --device cuda in a build with CUDA (a
// build without it fails in the constructor, before anything is allocated).
static const MemOps& run_memory(Device d) {
#ifdef MT_HAVE_CUDA
  if (d == Device::cuda) return cuda::device_memory();
#endif
  (void)d;
  return host_memory();
}

void NoiseScale::update(double g2_small, double g2_big, double b_small, double b_big) {
  if (!(b_big > b_small) || !std::isfinite(g2_small) || !std::isfinite(g2_big)) return;
  const double g2 = (b_big * g2_big - b_small * g2_small) / (b_big - b_small);
  const double s = (g2_small - g2_big) / (1.0 / b_small - 1.0 / b_big);
  const double a = count_ == 0 ? 0.0 : 0.95;  // EMA; the first estimate is taken as is
  g2_ = a * g2_ + (1 - a) * g2;
  s_ = a * s_ + (1 - a) * s;
  count_++;
}

Trainer::Trainer(const config::TrainOptions& o, parallel::Comm* world, int local_rank)
    : o_(o),
      own_world_(world ? nullptr : std::make_unique<parallel::SelfComm>("world")),
      world_(world ? *world : *own_world_),
      arena_(run_memory(o.device)),
      scaler_(o.loss_scale, o.precision == DType::f16) {
  o_.validate();
  (void)local_rank;  // used only by a CUDA build
  if (o_.threads > 0) omp_set_num_threads(o_.threads);
  if (o_.device == Device::cuda) {
    // Say which reason applies: no CUDA in this build, or no GPU here.
    const std::string why = ops::cuda_unavailable_reason();
    if (!why.empty()) fail("--device cuda: %s", why.c_str());
#ifdef MT_HAVE_CUDA
    // One GPU per process (one rank per GPU), chosen by the node-local rank, before anything is
    // allocated on it.
    cuda::set_device((local_rank >= 0 ? local_rank : world_.rank()) % cuda::device_count());
#endif
  }
  install_wait_policy();  // dist.timeout on every wait on peers from here on (train/stragglers.cpp)
  // Every rank must run the same configuration; one clear message if not.
  try {
    parallel::check_same_across_ranks(world_, o_.to_json().dump(), "the resolved config");
  } catch (const parallel::PeerTimeoutError&) {
    throw;  // a hung peer, not the options (exit status 4)
  } catch (const parallel::CollectiveError& e) {
    throw parallel::CollectiveError(e.what(), kExitRefused);  // options, not a failure: a relaunch repeats it
  }
  parallel::MeshLayout layout{o_.parallel.dp, o_.parallel.pp, o_.parallel.cp, o_.parallel.tp, o_.parallel.ep};
  // The host sub-communicators' staging buffers count as this run's comm memory (when the run's
  // arena is host memory; a device arena cannot hold MPI's host buffers).
  mesh_ = std::make_unique<parallel::Mesh>(parallel::resolve_layout(layout, world_.size()), world_,
                                           arena_.device() == Device::cpu ? &arena_ : nullptr);
  parallel::Comm& dp = mesh_->dp_comm();
  // The ranks that hold replicas of the same parameters and reduce their gradients together: dp, or
  // dp x cp under context parallelism (the cp ranks of a replica see different tokens of its rows).
  parallel::Comm& reps = replicas();
  ckpt_opts_.dir = o_.ckpt.dir.empty() ? (std::filesystem::path(o_.out_dir) / "checkpoints").string() : o_.ckpt.dir;
  ckpt_opts_.keep = o_.ckpt.keep;
  ckpt_opts_.async = o_.ckpt.async;
  // Async saves copy the state in the background while the next forward/backward runs; the
  // optimizer waits for that copy (snapshot_fence) before it changes the weights.
  ckpt_opts_.deferred_snapshot = o_.ckpt.async;
  ckpt_opts_.writer_priority = o_.ckpt.writer_priority;
  ckpt_opts_.sync_fallback = o_.ckpt.sync_fallback;
  ckpt_opts_.commit_timeout_s = o_.dist.timeout;  // the commit waits on peers like a collective
  ckpt_opts_.log = Logger(LogLevel::info, world_.size() > 1 ? world_.rank() : -1);
  // The checkpoint to start from is chosen before the batch is sized: its global batch may carry over.
  resume_path_ = choose_resume();
  if (!resume_path_.empty()) keep_saved_global_batch(resume_path_);
  settle_run_id(resume_path_.empty() ? "" : checkpoint::read_manifest(resume_path_).meta.value("run_id", ""));
  if (o_.global_batch > 0) {
    const int per_step = dp.size() * o_.grad_accum;
    if (o_.global_batch % per_step != 0)
      throw parallel::CollectiveError(
          strfmt("global_batch %d is not divisible by dp %d x grad_accum %d (dp larger than the batch allows?)",
                 o_.global_batch, dp.size(), o_.grad_accum), kExitRefused);
    o_.batch_size = o_.global_batch / per_step;
    if (o_.sequence_parallel() && (int64_t(o_.batch_size) * o_.seq_len) % o_.parallel.tp != 0)
      throw parallel::CollectiveError(
          strfmt("tp.sp: the rows of a micro-batch, batch_size %d (from global_batch) x seq_len %d, must be "
                 "divisible by --tp %d (or set tp.sp=false)", o_.batch_size, o_.seq_len, o_.parallel.tp), kExitRefused);
  }
  ctx_.device = o_.device;
  if (world_.size() > 1) {
    // The host's waits on the device (syncs, downloads, the loss) may sit behind a collective whose
    // peer hung: they poll under dist.timeout like every wait on peers (parallel/mesh.h Mesh::until).
    ctx_.wait = mesh_.get();
    arena_.set_device_wait(mesh_.get());
  }
  if (o_.profile_ops) {
#ifdef MT_HAVE_CUDA
    op_timer_ = o_.device == Device::cuda ? cuda::make_event_timer(ctx_.stream) : ops::make_host_timer();
#else
    op_timer_ = ops::make_host_timer();
#endif
    ctx_.timer = op_timer_.get();
  }
#ifdef MT_HAVE_CUDA
  // On a device, waiting for a reduction only queues a stream wait: the exposed time is the compute
  // stream's, between two events around finish_grads (bench's "grad comm wait", metrics' grad_wait).
  if (o_.device == Device::cuda) grad_wait_timer_ = cuda::make_event_timer(ctx_.stream);
#endif
  if (o_.trace.on) {
    trace_ = std::make_unique<Trace>(world_.rank(), strfmt("rank %d %s", world_.rank(), mesh_->str().c_str()));
    trace_->lane("step");  // the first row: the steps, then ops, pipeline actions and communication
    ctx_.trace = trace_.get();
    ctx_.trace_lane = trace_->lane("ops");
  }
  arena_.set_poison_reused(o_.mem_poison);
  if (op_timer_ || trace_) {
    regions_ = std::make_unique<ops::Regions>(op_timer_.get(), trace_.get(), ctx_.trace_lane);
    ctx_.regions = regions_.get();
    arena_.set_region_sink(regions_.get());
  }
  // The cp ranks of a dp replica read the same rows and keep their zigzag chunks of them.
  const int cp_rank = mesh_->coord(parallel::MeshDim::cp);
  train_data_ = zigzag_batches(open_batches(o_, "train", dp.rank(), dp.size()), mesh_->cp(), cp_rank);
  if (train_data_->vocab_size() > o_.model.vocab_size)
    fail("data '%s' uses a vocabulary of %d tokens but model.vocab_size is %d",
         (o_.data.mix.empty() ? o_.data.path : o_.data.mix).c_str(), train_data_->vocab_size(), o_.model.vocab_size);
  if (o_.eval_every > 0) {
    val_data_ = zigzag_batches(open_batches(o_, "val", dp.rank(), dp.size()), mesh_->cp(), cp_rank);
    if (val_data_->vocab_size() > o_.model.vocab_size)
      fail("validation data '%s' uses a vocabulary of %d tokens but model.vocab_size is %d",
           (o_.data.val_path.empty() ? o_.data.path : o_.data.val_path).c_str(), val_data_->vocab_size(),
           o_.model.vocab_size);
    check_same_tokenizer(o_, *train_data_, *val_data_);
  }
  if (mesh_->tp() > 1) {
    // On the GPU the activations and partial gradients travel over NCCL, bootstrapped by the tp
    // group's host communicator (which keeps the scalar reductions), on its own stream; 16-bit
    // activations are summed in fp32 (parallel/nccl_comm.h).
    parallel::Comm* tp_data = nullptr;
    if (device_comm(parallel::MeshGroup::tp))
      tp_data = &mesh_->add_device_comm(parallel::MeshGroup::tp, ctx_.stream, /*wide_sums=*/true);
    tp_ = parallel::TensorParallel(mesh_->tp_comm(), o_.sequence_parallel(), tp_data);
  }
  // Pipeline parallelism: this rank registers and runs only its stages' layers (train/pipeline.h).
  const model::StagePlan plan = mesh_->pp() > 1 ? config::stage_plan(o_, mesh_->coord(parallel::MeshDim::pp)) : model::StagePlan();
  // Expert parallelism holds each rank's routed experts apart, in a store sharded over the expert-data
  // group (the ranks computing the same experts) instead of dp x cp.
  model::ExpertPlacement experts;
  if (mesh_->ep() > 1 && o_.model.moe.enabled())
    experts = model::ExpertPlacement{mesh_->ep(), mesh_->ep_comm().rank(), &expert_store_};
  gpt_ = std::make_unique<model::GPT>(o_.model, store_, tp_, plan, experts);
  store_.finalize(arena_, o_.precision, reps.size(), parallel::storage_for_zero(o_.parallel.zero));
  if (!expert_store_.entries().empty())
    expert_store_.finalize(arena_, o_.precision, mesh_->expert_data_comm().size(),
                           parallel::storage_for_zero(o_.parallel.zero));
  gpt_->set_arena(&arena_);
  gpt_->set_ctx(ctx_);
  gpt_->set_recompute(o_.recompute);
  gpt_->set_attention(o_.attention_kind());
  if (mesh_->cp() > 1) {
    // On the GPU the key/value blocks travel over NCCL; the document ids stay on the host communicator.
    parallel::Comm* blocks = nullptr;
    if (device_comm(parallel::MeshGroup::cp)) blocks = &mesh_->add_device_comm(parallel::MeshGroup::cp, ctx_.stream);
    gpt_->set_context_parallel(parallel::RingAttention(mesh_->cp_comm(), &arena_, blocks));
  }
  if (mesh_->ep() > 1) {
    // On the GPU the rows travel over NCCL (the counts stay on the host communicator).
    parallel::Comm* rows = nullptr;
    if (device_comm(parallel::MeshGroup::ep)) rows = &mesh_->add_device_comm(parallel::MeshGroup::ep, ctx_.stream);
    gpt_->set_expert_parallel(&mesh_->ep_comm(), rows);
  }
  // Every rank initialises the same full weights, then keeps its shard.
  if (!o_.init_from.empty()) {
    model::import_hf(*gpt_, store_, o_.init_from);
    if (!expert_store_.entries().empty()) model::import_hf(*gpt_, expert_store_, o_.init_from);
  } else {
    gpt_->init_weights(o_.seed);
  }
  parallel::DataParallelOptions dpo;
  dpo.zero = o_.parallel.zero;
  dpo.bucket_bytes = size_t(o_.parallel.bucket_mb * 1024 * 1024);
  dpo.embedding_rows = o_.parallel.embedding_rows && mesh_->tp() == 1 && mesh_->pp() == 1;
  // Gradient and parameter collectives on the GPU: NCCL over the dp group, bootstrapped by its host
  // communicator, on a communication stream ordered after the compute stream.
  parallel::Comm* dp_device = nullptr;
#ifdef MT_HAVE_NCCL
  if (device_comm(replica_group())) dp_device = &mesh_->add_device_comm(replica_group(), ctx_.stream);
#endif
  dp_ = std::make_unique<parallel::DataParallel>(store_, reps, arena_, dpo, ctx_, dp_device);
  if (tp_.active()) {
    // Partial gradients (sequence-parallel LayerNorms, positions) are summed over tp, then reduced
    // over dp.
    tp_grads_ = std::make_unique<parallel::TensorParallelGrads>(store_, tp_, *dp_);
    gpt_->set_unit_hooks(tp_grads_.get());
  } else {
    gpt_->set_unit_hooks(dp_.get());
  }
  // The noise scale's per-rank norm: each parameter once over tp and pp, the tied copies left out.
  if (tp_.active() || mesh_->pp() > 1) dp_->set_counted_entries(noise_scale_entries());
  if (!expert_store_.entries().empty()) build_expert_state(dpo);
  if (mesh_->pp() > 1) {
    // On the GPU activations, their gradients and the tied gradient travel over NCCL, bootstrapped by
    // the pp group's host communicator (which keeps the scalars), on its own stream; the executor
    // pairs each step's sends and receives (parallel/pipeline_exchange.h) and its bubble is timed with
    // CUDA events on the compute stream.
    parallel::Comm* messages = &mesh_->pp_comm();
    if (device_comm(parallel::MeshGroup::pp)) messages = &mesh_->add_device_comm(parallel::MeshGroup::pp, ctx_.stream);
    pipeline_ = std::make_unique<Pipeline>(o_, mesh_->pp_comm(), *messages, *gpt_, store_, *dp_, arena_, ctx_);
    pipeline_->set_expert_data_parallel(expert_dp_.get());
#ifdef MT_HAVE_CUDA
    if (o_.device == Device::cuda)
      pipeline_->set_timers(cuda::make_event_timer(ctx_.stream), cuda::make_event_timer(ctx_.stream));
#endif
  }
  // NCCL connects each communicator and peer lazily, its buffers outside the memory pool: connect
  // everything the step uses now, before step 1's activation peak fills the pool (parallel/mesh.h).
  const std::string warmed = mesh_->warm_device_comms();
  if (!warmed.empty() && world_.rank() == 0)
    std::fprintf(stderr, "minitrain: NCCL connected before step 1 (rank 0): %s\n", warmed.c_str());
  adam_ = std::make_unique<AdamW>(o_.optim, store_, dp_->segments(), arena_);
  step_scalars_ = arena_.alloc(MemCategory::optimizer, sizeof(StepScalars));
  micro_.resize(size_t(o_.grad_accum));
  gpt_->set_phase_hook([this](const char* phase) { fault(phase); });
  if (arena_.device() != Device::cpu) {
    // The pieces of a save point into device memory: stage them with device-to-host copies.
    const MemOps mem = arena_.mem();
    ckpt_opts_.staging.copy = [mem](void* dst, const void* src, size_t bytes) { mem.download(dst, src, bytes); };
#ifdef MT_HAVE_CUDA
    // Page-locked staging: device-to-host copies run at full link speed (allocated once, reused). The
    // hooks may run on the checkpointer's thread: each first makes this run's GPU that thread's device.
    // The copies run on a stream of their own behind an event recorded at save time, so a deferred
    // snapshot overlaps the next step's forward and backward (kernels/cuda/snapshot_copy.h).
    const int dev = cuda::current_device();
    auto copier = std::make_shared<cuda::SnapshotCopier>(ctx_.stream);
    ckpt_opts_.staging.mark = [copier] { copier->mark(); };
    ckpt_opts_.staging.copy = [copier](void* dst, const void* src, size_t bytes) { copier->copy(dst, src, bytes); };
    ckpt_opts_.staging.alloc = [dev](size_t bytes) {
      cuda::use_device(dev);
      return cuda::pinned_alloc(bytes);
    };
    ckpt_opts_.staging.free = [](void* p) { cuda::pinned_free(p); };
#endif
  }
  if (trace_) {
    for (parallel::Comm* c : comms())
      if (c->size() > 1) c->set_trace(trace_.get());
    if (world_.size() > 1) world_.set_trace(trace_.get());
    if (pipeline_) pipeline_->set_trace(trace_.get());
  }
  if (!resume_path_.empty()) load_checkpoint(resume_path_);
}

// The world communicator is the caller's and outlives this trainer: it must not keep pointing at our
// trace.
Trainer::~Trainer() {
  arena_.set_region_sink(nullptr);  // members released below must not reach the sink as it goes
  // Unwinding on an error, NCCL kernels may wait for peers that will never come, and the checkpoint
  // writer (destroyed before the mesh) may wait on the device behind them: end them first.
  if (std::uncaught_exceptions() > 0 && mesh_) mesh_->abort_device_comms();
  if (trace_) world_.set_trace(nullptr);
  world_.set_wait_policy({world_.wait_policy().timeout_s, nullptr});  // nor at our flight-record writer
}

parallel::CommCounters Trainer::group_counters(parallel::MeshDim d) const {
  const parallel::MeshGroup g = d == parallel::MeshDim::dp ? replica_group() : parallel::group_of(d);
  const parallel::Comm* device = mesh_->device_comm(g);
  parallel::CommCounters c = d == parallel::MeshDim::dp ? replicas().counters() : mesh_->comm(d).counters();
  if (device) c += device->counters();
  // The experts' gradients and parameters travel over the expert-data group, a part of dp x cp.
  if (d == parallel::MeshDim::dp && expert_dp_) {
    c += mesh_->expert_data_comm().counters();
    if (const parallel::Comm* x = mesh_->device_comm(parallel::MeshGroup::expert_data)) c += x->counters();
  }
  return c;
}

std::vector<parallel::Comm*> Trainer::comms() const { return mesh_->comms(); }

bool Trainer::device_comm(parallel::MeshGroup g, bool experts_apart) const {
  return parallel::device_comm_size(g, o_.device, mesh_->layout(), o_.parallel.zero, experts_apart) > 0;
}

parallel::CommCounters Trainer::ep_counters() const {
  parallel::CommCounters c;
  if (mesh_->ep() > 1) c += mesh_->ep_comm().counters();  // the counts (and the rows, on the CPU)
  if (parallel::Comm* rows = mesh_->device_comm(parallel::MeshGroup::ep)) c += rows->counters();  // on GPUs
  return c;
}

void Trainer::reset_group_counters() {
  for (parallel::Comm* c : comms()) c->reset_counters();
}

// The gradient noise scale from this step's norms (after the optimizer: the gradients are intact,
// AdamW applies its factor without writing them back). One rank: the first micro-batch's gradient
// against the whole batch's; several: each rank's own gradient against the reduced one.
void Trainer::update_noise_scale(StepResult& r, double first_sum_sq, double inv_scale, int32_t valid,
                                 int32_t valid_local) {
  parallel::Comm& dp = replicas();
  if (noise_scale_from_micro()) {
    const int valid0 = valid_targets(micro_[0]);
    const double to_mean = double(valid) / double(valid0) * inv_scale;
    r.local_grad_sq = first_sum_sq * to_mean * to_mean;
    gns_.update(r.local_grad_sq, r.grad_norm * r.grad_norm, double(valid0), double(valid));
  } else if (dp.size() > 1 && dp_->stats().local_grad_sq_valid && valid_local > 0) {
    // This rank's own gradient, rescaled to the mean over its tokens, averaged over ranks. A
    // data-parallel replica's gradient is spread over its tp and pp ranks: summed there.
    const double to_mean = double(valid) / double(valid_local) * inv_scale;
    double local = dp_->local_grad_sq();
    if (tp_.active()) local = parallel::all_reduce_sum_double(tp_.comm(), local);
    if (pipeline_) local = parallel::all_reduce_sum_double(mesh_->pp_comm(), local);
    r.local_grad_sq = parallel::all_reduce_sum_double(dp, local * to_mean * to_mean) / dp.size();
    // Both norms over the same parameters: the embeddings are left out when they went as rows, and
    // under pp the tied wte (a rank's own gradient of it is two parts, on the first and last stages).
    const int first = dp_->stats().local_grad_sq_first_unit;
    double g2_big = r.grad_norm * r.grad_norm;
    if (pipeline_) {
      // The global norm less the tied wte's share: a pass over wte only, not a second one over the
      // whole gradient.
      std::vector<char> tied = counted_entries();
      for (size_t i = 0; i < tied.size(); i++) tied[i] = tied[i] && (store_.entry(int(i)).replicated & kAxisPp);
      double s = dp_->grad_sum_squares(tied);
      if (tp_.active()) s = parallel::all_reduce_sum_double(tp_.comm(), s);
      g2_big -= parallel::all_reduce_sum_double(mesh_->pp_comm(), s) * inv_scale * inv_scale;
    } else if (first != 0) {
      g2_big = dp_->grad_sum_squares(first) * inv_scale * inv_scale;  // the dense store's only
    }
    if (experts_held_apart() && first == 0) {
      // Experts held apart are left out of both norms: a rank's own expert gradient comes from the
      // tokens of its whole ep group, not from its share of the batch.
      double x = expert_sq_;
      if (tp_.active()) x = parallel::all_reduce_sum_double(tp_.comm(), x);
      if (pipeline_) x = parallel::all_reduce_sum_double(mesh_->pp_comm(), x);
      g2_big -= x * inv_scale * inv_scale;
    }
    gns_.update(r.local_grad_sq, g2_big, double(valid) / dp.size(), double(valid));
  }
}

std::vector<char> Trainer::noise_scale_entries() const {
  std::vector<char> counted = counted_entries();
  for (size_t i = 0; i < counted.size(); i++)
    if (store_.entry(int(i)).replicated & kAxisPp) counted[i] = 0;
  return counted;
}

std::vector<char> Trainer::counted_entries() const {
  std::vector<char> counted;
  const int pp_rank = mesh_->coord(parallel::MeshDim::pp);
  for (const ParamEntry& e : store_.entries())
    counted.push_back((!(e.replicated & kAxisTp) || tp_.rank() == 0) && (!(e.replicated & kAxisPp) || pp_rank == 0));
  return counted;
}

StepResult Trainer::step() {
  // Traced steps record from here until step() returns (after the step's span ends).
  struct StopRecording {
    Trace* t;
    ~StopRecording() {
      if (t) t->set_recording(false);
    }
  } const stop{trace_.get()};
  if (trace_) trace_->set_recording(step_ + 1 >= o_.trace.start && step_ + 1 < o_.trace.start + o_.trace.steps);
  const Trace::Span step_span(trace_.get(), 0, "step", trace_ ? "step " + std::to_string(step_ + 1) : std::string());
  StepResult r;
  parallel::Comm& dp = replicas();  // every token once: the dp replicas' rows, each cut over cp
  const auto t0 = clock_type::now();
  const double wait0 = train_data_->wait_seconds();
  int32_t valid_local = 0;
  int32_t valid = 0;
  {
    const ops::Region region(ctx_, "data");
    for (size_t k = 0; k < micro_.size(); k++) {
      HostBatch& b = micro_[k];
      train_data_->next(b);
      if (batch_hook_) batch_hook_(k, b);
      valid_local += valid_targets(b);
      r.tokens_per_rank += long(b.B) * b.T;
    }
    r.t_data = train_data_->wait_seconds() - wait0;
    valid = valid_local;
    dp.all_reduce(&valid, 1, DType::i32, parallel::ReduceOp::sum);
  }
  MT_CHECK(valid > 0, "a global batch without any target token");
  r.tokens = r.tokens_per_rank * dp.size();

  // Loss is the mean over the valid targets of the whole global batch; fp16 scales it up. The
  // reductions sum, so every rank's gradient contributions are weighted by the global count.
  const float dloss = scaler_.scale() / float(valid);
  {
    const ops::Region region(ctx_, "zero grads");
    dp_->begin_step();
    if (expert_dp_) expert_dp_->begin_step();
  }
  reset_group_counters();
  gpt_->reset_times();
  gpt_->reset_moe_stats();
  double loss_sum = 0;
  const bool gns_from_micro = noise_scale_from_micro();
  // Scalars of this step that stay in the arena's memory until the step is done: on a GPU the host
  // waits inside a step only for the logged loss (and for fp16's finiteness check).
  StepScalars* dev = scalars();
  if (pipeline_) {
    pipeline_->step(micro_, dloss);  // the schedule decides each micro-batch's last-ness
  } else {
    for (size_t k = 0; k < micro_.size(); k++) {
      dp_->set_last_micro(k + 1 == micro_.size());
      if (expert_dp_) expert_dp_->set_last_micro(k + 1 == micro_.size());
      loss_sum += gpt_->forward_backward(view(micro_[k]), dloss);
      if (k == 0 && gns_from_micro)
        ops::sum_squares_into(&dev->first_sum_sq, store_.grads(), store_.total_numel(), false, ctx_);
    }
  }
  {
    const ops::Region region(ctx_, "grad reduction");
    if (grad_wait_timer_) grad_wait_timer_->begin("grad_wait", 0);
    dp_->finish_grads();
    if (expert_dp_) expert_dp_->finish_grads();
    if (grad_wait_timer_) grad_wait_timer_->end();
    if (pipeline_) pipeline_->sum_tied_grads();
  }
  {
    const ops::Region region(ctx_, "loss");
    if (pipeline_) loss_sum = pipeline_->loss_sum();  // the step's one wait for the device, with the reductions queued
    // Only the last pipeline stage has losses: the sum over pp is its sum, exactly.
    double total = parallel::all_reduce_sum_double(dp, loss_sum);
    if (pipeline_) total = parallel::all_reduce_sum_double(mesh_->pp_comm(), total);
    r.loss = total / valid;
  }
  r.t_forward = gpt_->times().forward;
  r.t_backward = gpt_->times().backward;
  r.t_grad_wait = dp_->stats().grad_wait_s + (expert_dp_ ? expert_dp_->stats().grad_wait_s : 0.0);

  const auto t_opt = clock_type::now();
  std::optional<ops::Region> region(std::in_place, ctx_, "grad norm");
  if (ckpt_) ckpt_->snapshot_fence();
  fault("optimizer");
  bool finite = !scaler_.enabled() || (dp_->grads_finite() && expert_grads_finite());
  if (scaler_.enabled() && (tp_.active() || pipeline_)) {  // ranks hold different parts: agree on one answer
    int32_t bad = finite ? 0 : 1;
    if (tp_.active()) tp_.comm().all_reduce(&bad, 1, DType::i32, parallel::ReduceOp::max);
    if (pipeline_) mesh_->pp_comm().all_reduce(&bad, 1, DType::i32, parallel::ReduceOp::max);
    finite = bad == 0;
  }
  r.lr = lr_at(o_.optim, step_, o_.steps);
  const double inv_scale = 1.0 / scaler_.scale();
  if (finite) {
    // The norm, and from it the unscale-and-clip factor AdamW applies, are computed on the device; a
    // gradient sharded over ranks is summed through the host first (a collective anyway).
    if (tp_.active() || pipeline_ || expert_dp_) {
      // Every parameter once: the split ones on every tp rank, the replicated ones on tp rank 0, each
      // stage's own, the tied wte on the first stage, each expert on the ep rank holding it.
      expert_sq_ = expert_grad_sum_squares();
      double sum_sq = (tp_.active() || pipeline_ ? dp_->grad_sum_squares(counted_entries()) : dp_->grad_sum_squares()) +
                      expert_sq_;
      if (tp_.active()) sum_sq = parallel::all_reduce_sum_double(tp_.comm(), sum_sq);
      if (pipeline_) sum_sq = parallel::all_reduce_sum_double(mesh_->pp_comm(), sum_sq);
      arena_.upload(&dev->sum_sq, &sum_sq, sizeof(sum_sq));
    } else if (dp_->grad_norm_is_local()) {
      dp_->grad_sum_squares_into(&dev->sum_sq);
    } else {
      const double sum_sq = dp_->grad_sum_squares();
      arena_.upload(&dev->sum_sq, &sum_sq, sizeof(sum_sq));
    }
    ops::clip_coefficient(&dev->coef, &dev->sum_sq, inv_scale, o_.optim.grad_clip, ctx_);
    region.emplace(ctx_, "optimizer");
    adam_->step(dp_->master_shard(), dp_->grad_shard(), r.lr, ++updates_, ctx_, &dev->coef);
    dp_->publish_params();
    if (expert_dp_) {
      expert_adam_->step(expert_dp_->master_shard(), expert_dp_->grad_shard(), r.lr, updates_, ctx_, &dev->coef);
      expert_dp_->publish_params();
    }
  } else {
    r.skipped = true;
    r.grad_norm = NAN;
  }
  region.emplace(ctx_, "step scalars");
  scaler_.update(!finite);
  step_++;
  arena_.mem().sync();  // on a device the optimizer's kernels are still queued: time them, not their launch
  r.t_optimizer = since(t_opt);
  if (grad_wait_timer_) {  // the device has passed both events: no wait here
    r.t_grad_wait = grad_wait_timer_->totals().at(0).seconds;
    grad_wait_timer_->reset();
  }
  if (finite) {
    StepScalars host{};
    arena_.mem().download(&host, dev, sizeof(host));
    r.grad_norm = std::sqrt(host.sum_sq) * inv_scale;
    update_noise_scale(r, host.first_sum_sq, inv_scale, valid, valid_local);
  }
  if (o_.model.moe.enabled()) r.moe = finish_moe_step();
  if (o_.parallel.sdc_every > 0 && step_ % o_.parallel.sdc_every == 0) check_replicas();
  region.reset();
  r.t_total = since(t0);
  return r;
}

double Trainer::evaluate() {
  MT_CHECK(val_data_ != nullptr, "evaluate() without validation data (eval_every=0)");
  BatchSource& src = *val_data_;
  src.rewind();
  HostBatch b;
  double sum = 0;
  int32_t valid = 0;
  for (int i = 0; i < o_.eval_batches; i++) {
    src.next(b);
    sum += pipeline_ ? pipeline_->forward_loss(b) : gpt_->forward_loss(view(b));
    valid += valid_targets(b);
  }
  parallel::Comm& dp = replicas();
  dp.all_reduce(&valid, 1, DType::i32, parallel::ReduceOp::sum);
  sum = parallel::all_reduce_sum_double(dp, sum);
  if (pipeline_) sum = parallel::all_reduce_sum_double(mesh_->pp_comm(), sum);  // the last stage's
  return valid ? sum / double(valid) : NAN;
}

std::vector<float> Trainer::full_master() {
  std::vector<float> full(static_cast<size_t>(store_.total_numel()));
  dp_->gather_full(dp_->master_shard(), full.data());
  return full;
}

}  // namespace mt::train
