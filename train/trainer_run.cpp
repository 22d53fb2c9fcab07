// Trainer::run: the whole job around step() — output directory, config, JSONL metrics, progress line,
// evaluation, periodic saves, final state and HF export. Rank 0 writes; every rank computes.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>

#include "checkpoint/format.h"
#include "checkpoint/fsio.h"
#include "model/hf_io.h"
#include "plan/memory.h"
#include "runtime/check.h"
#include "runtime/exit_status.h"
#include "runtime/format.h"
#include "runtime/preempt.h"
#include "train/divergence.h"
#include "train/run_summary.h"
#include "train/stragglers.h"
#include "train/trainer.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mt::train {

namespace fs = std::filesystem;

bool peak_is_measured(const config::TrainOptions& o) {
  if (o.peak_flops > 0) return false;
#ifdef MT_HAVE_CUDA
  if (o.device == Device::cuda) return false;  // the datasheet's
#endif
  return true;
}

plan::Peak run_peak(const config::TrainOptions& o, int threads, double seconds) {
  if (peak_is_measured(o)) return calibrate_cpu_peak(threads, seconds);
  if (o.peak_flops > 0) return plan::Peak{o.peak_flops, "user-given peak"};
#ifdef MT_HAVE_CUDA
  if (o.device == Device::cuda) {
    const std::string name = cuda::device_name();
    const plan::Peak p = plan::gpu_peak_from_name(name);
    if (p.flops <= 0) fail("no datasheet peak known for GPU '%s': give it as peak_flops=<FLOP/s>", name.c_str());
    return plan::Peak{p.flops, name + ", " + p.label, p.bytes_per_s};
  }
#endif
  fail("no peak for device %d", int(o.device));  // peak_is_measured covers every other case
}

void Trainer::write_trace(const std::string& dir) {
  if (!trace_) return;
  trace_->set_recording(false);
  fs::create_directories(dir);
  const std::string path = (fs::path(dir) / strfmt("rank_%05d.json", world_.rank())).string();
  trace_->write(path);
  if (world_.rank() == 0)
    std::fprintf(stderr, "minitrain: trace of steps %d to %d in %s/rank_*.json (%zu spans on rank 0%s; open in Perfetto)\n",
                 o_.trace.start, o_.trace.start + o_.trace.steps - 1, dir.c_str(), trace_->events(),
                 trace_->dropped() ? strfmt(", %zu dropped", trace_->dropped()).c_str() : "");
}

void Trainer::preempt_fault(const char* phase) {
  if (std::string(phase) != "forward" || step_ + 1 != ckpt_opts_.fault_step || world_.rank() != ckpt_opts_.fault_rank ||
      preemption_signal() != 0)
    return;
  std::fprintf(stderr, "[fault] rank %d: SIGTERM at step %d, phase %s\n", world_.rank(), step_ + 1, phase);
  std::fflush(stderr);
  std::raise(SIGTERM);  // the handler (runtime/preempt.h) records it; the step boundary acts on it
}

int Trainer::agreed_preemption() {
  int32_t sig = preemption_signal();
  if (world_.size() > 1) world_.all_reduce(&sig, 1, DType::i32, parallel::ReduceOp::max);
  return sig;
}

int Trainer::run() {
  const fs::path out(o_.out_dir);
  const fs::path metrics_path = out / "metrics.jsonl";
  // resume=auto may find nothing yet, and resume=fresh starts over in the directory: both append.
  const bool resuming = !o_.resume.empty();
  const bool writer = world_.rank() == 0;
  // Rank 0 looks before anyone writes, and tells the others, so every rank fails the same way.
  int32_t taken = writer && !resuming && fs::exists(metrics_path);
  world_.broadcast(&taken, 1, DType::i32, 0);
  if (taken)
    throw parallel::CollectiveError(strfmt(
        "out_dir '%s' already holds a run (metrics.jsonl); choose another --out, resume=auto to continue it, or resume=fresh to start over in it",
        o_.out_dir.c_str()), kExitRefused);
  check_fault_plan();  // before anything is written
  lock_run_dirs(true);
  arm_fault_injection();
  JsonlWriter log;
  ResumeHistory history;  // rank 0: the earlier attempts' lost work
  if (writer) {
    fs::create_directories(out);
    checkpoint::io::write_file_atomically((out / "config.json").string(), o_.to_json().dump(2) + "\n");
    if (resuming && fs::exists(metrics_path)) history = resume_history(checkpoint::io::read_file(metrics_path.string()), step_);
    log = JsonlWriter(metrics_path.string(), resuming);
    if (log.cut_bytes())
      std::fprintf(stderr, "minitrain: %s ended in a torn record (%llu bytes, from an interrupted run): cut\n",
                   metrics_path.c_str(), (unsigned long long)log.cut_bytes());
  }
  const int threads = o_.threads > 0 ? o_.threads : omp_get_max_threads();
  const plan::Peak peak = run_peak(o_, threads, kPeakSeconds);
  const double flops_tok = o_.model.flops_per_token(o_.seq_len);
  const double hw_flops_tok = model::hardware_flops_per_token(o_.model, o_.seq_len, o_.recompute, o_.attention_kind(), o_.device);
  const double world_peak = peak.flops * world_.size();
  if (writer) {
    RunPlan plan = make_run_plan(o_, *mesh_, peak, flops_tok, step_, ckpt_opts_.dir,
                                 train_data_ ? train_data_->num_tokens() : 0, arena_.stats());
    plan.data_docs = train_data_ ? train_data_->num_docs() : 0;
    try {  // the planner's figures for rank 0 (pipeline rank 0); a layout it does not model gets none
      const plan::MemoryPlan mp = plan::plan_memory(o_, mesh_->layout(), 0);
      for (int c = 0; c < kNumMemCategories; c++) plan.expected[size_t(c)] = mp.bytes[size_t(c)];
      plan.expected_nccl = mp.nccl;
    } catch (const Error&) {
    }
    std::fputs(format_run_plan(plan).c_str(), stderr);
    log.write({{"event", "start"}, {"run_id", o_.run_id}, {"config", o_.to_json()}, {"params", o_.model.num_params()},
               {"active_params", o_.model.num_active_params()},
               {"world_size", world_.size()}, {"flops_per_token", flops_tok}, {"peak_flops_per_rank", peak.flops},
               {"peak_label", peak.label}, {"resumed_at", step_}});
  }

  const auto t_run = std::chrono::steady_clock::now();
  auto since_run = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_run).count(); };
  const int first = step_;
  int64_t logged_save = -1;
  DivergenceGuard guard(o_.loss_scale.max_skips);
  RunTotals totals;
  totals.set_history(history);
  StragglerTally stragglers;
  // Every rank's busy time is gathered each step when the check is on (one float per rank).
  const bool check_stragglers = world_.size() > 1 && o_.dist.straggler_ratio > 0;
  while (step_ < o_.steps) {
    arena_.reset_peaks();
    const auto t_step = std::chrono::steady_clock::now();
    const auto t_busy = std::chrono::steady_clock::now();
    const double blocked0 = blocked_seconds();
    delay_faults();  // fault injection: ckpt.fault_phase=hang|straggler
    const StepResult r = step();
    // This rank's busy time in the step: its wall time less its waits on peers.
    const double busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_busy).count() -
                        (blocked_seconds() - blocked0);
    const auto t_step_end = std::chrono::steady_clock::now();
    const double tok_s = r.tokens / r.t_total;
    const double mfu = tok_s * flops_tok / world_peak, hfu = tok_s * hw_flops_tok / world_peak;
    nlohmann::json j = {{"step", step_}, {"loss", r.loss}, {"lr", r.lr}, {"tokens_per_s", tok_s},
                        {"mfu", mfu}, {"hfu", hfu}, {"skipped", r.skipped},
                        {"time", {{"data", r.t_data}, {"forward", r.t_forward}, {"backward", r.t_backward},
                                  {"grad_wait", r.t_grad_wait}, {"optimizer", r.t_optimizer}, {"total", r.t_total}}},
                        {"memory", memory_json(arena_.stats())}};
    totals.add_step(step_, r, mfu, hfu, arena_.stats());
    if (gns_.valid()) totals.set_noise_scale(gns_.b_simple(), double(r.tokens));
    j["grad_norm"] = std::isfinite(r.grad_norm) ? nlohmann::json(r.grad_norm) : nlohmann::json();
    if (scaler_.enabled()) j["loss_scale"] = scaler_.scale();
    if (replicas().size() > 1) j["comm_dp"] = parallel::counters_json(group_counters(parallel::MeshDim::dp));
    if (mesh_->tp() > 1) j["comm_tp"] = parallel::counters_json(group_counters(parallel::MeshDim::tp));
    if (mesh_->cp() > 1) j["comm_cp"] = parallel::counters_json(group_counters(parallel::MeshDim::cp));  // ring attention
    if (mesh_->ep() > 1) j["comm_ep"] = parallel::counters_json(ep_counters());  // the experts' token all-to-alls
    if (pipeline_) {
      j["comm_pp"] = parallel::counters_json(group_counters(parallel::MeshDim::pp));
      j["pp"] = pipeline_->step_json();  // after comm_pp: its own gather is not the step's traffic
    }
    if (!r.moe.is_null()) j["moe"] = r.moe;
    StragglerVerdict slow;
    if (check_stragglers) {
      const std::vector<double> all_busy = gather_busy(busy);
      slow = judge_stragglers(all_busy, o_.dist.straggler_ratio);
      stragglers.add(all_busy, slow);
      j["busy"] = {{"median_s", slow.median_s}, {"max_s", slow.max_s}, {"max_rank", slow.rank}};
      if (slow.straggler) j["straggler"] = {{"rank", slow.rank}, {"ratio", slow.ratio}};
    }
    if (gns_.valid()) j["gns"] = {{"b_simple", gns_.b_simple()}, {"g2", gns_.g2()}, {"trace_sigma", gns_.trace_sigma()}};
    if (o_.eval_every > 0 && (step_ % o_.eval_every == 0 || step_ == o_.steps)) {
      const double v = evaluate();
      j["val_loss"] = v;
      totals.add_val_loss(v);
    }
    if (ckpt_) {
      // A step that ran beside a background write shared the machine with it (scripts/supervise
      // takes its slowdown out of the goodput).
      const double beside = ckpt_->background_overlap(t_step, t_step_end);
      if (beside > 0) j["ckpt_overlap_s"] = beside;
      const auto saved = ckpt_->last_completed();
      if (saved && saved->step != logged_save) {
        j["checkpoint"] = {{"step", saved->step}, {"blocking_s", saved->blocking_s},
                           {"background_s", saved->background_s}, {"stall_s", saved->stall_s}, {"bytes", saved->bytes},
                           {"writer_cpu_s", saved->writer_cpu_s}};
        if (o_.ckpt.async && saved->synchronous) j["checkpoint"]["synchronous"] = true;  // the fallback
        logged_save = saved->step;
      }
    }
    if (writer) log.write(j);
    if (writer && (step_ % o_.log_every == 0 || step_ == o_.steps)) {
      const double elapsed = since_run();
      const double eta = elapsed / (step_ - first) * (o_.steps - step_);
      const std::string moe =
          r.moe.is_null() ? ""
                          : strfmt(" | aux %.4f z %.4f drop %.1f%% imbalance %.2f", r.moe["aux_loss"].get<double>(),
                                   r.moe["z_loss"].get<double>(), 100 * r.moe["drop_fraction"].get<double>(),
                                   r.moe["imbalance"].get<double>());
      std::fprintf(stderr, "step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | MFU %.1f%%%s | ETA %s%s%s%s\n",
                   step_, o_.steps, r.loss, r.lr, r.grad_norm, tok_s, 100 * mfu, moe.c_str(),
                   format_duration(eta).c_str(), r.skipped ? " | skipped (fp16 overflow)" : "",
                   j.contains("val_loss") ? strfmt(" | val %.4f", j["val_loss"].get<double>()).c_str() : "",
                   slow.straggler ? strfmt(" | straggler rank %d x%.2f", slow.rank, slow.ratio).c_str() : "");
    }
    const std::string diverged = guard.problem(step_, r, scaler_.scale());
    if (!diverged.empty()) {
      wait_checkpoint();  // the save in flight holds an earlier, finite step: let it commit
      throw DivergenceError(diverged);
    }
    const bool saved_here = o_.save_every > 0 && step_ % o_.save_every == 0 && step_ != o_.steps;
    if (saved_here) {
      save_checkpoint();
      totals.add_checkpoint(step_);  // a save that fails ends the run (here or at the next wait)
    }
    // Preemption: the ranks agree at this boundary (one tiny reduction), save the step reached,
    // wait for the write to commit and stop; resume=auto continues from it bitwise.
    if (step_ < o_.steps) {
      if (const int sig = agreed_preemption()) {
        if (!saved_here) save_checkpoint();
        wait_checkpoint();
        if (writer) {
          log.write({{"event", "preempted"}, {"step", step_}, {"signal", sig == SIGUSR1 ? "SIGUSR1" : "SIGTERM"},
                     {"seconds", since_run()}});
          std::fprintf(stderr,
                       "minitrain: preempted (%s): saved step %d in %s; resume=auto continues from it (exit status %d)\n",
                       sig == SIGUSR1 ? "SIGUSR1" : "SIGTERM", step_, ckpt_opts_.dir.c_str(), kExitPreempted);
        }
        // Every rank returns only after rank 0 has said so: under mpirun the first rank to exit non-zero
        // has the others killed.
        world_.barrier();
        out_lock_ = DirLock();
        ckpt_lock_ = DirLock();
        return kExitPreempted;
      }
    }
  }
  if (trace_) write_trace((out / "trace").string());
  save_checkpoint();
  wait_checkpoint();
  totals.add_checkpoint(step_);
  // The weights for Hugging Face from the checkpoint just committed: one layout-free path for every
  // layout (the checkpoint holds each tensor whole, whoever wrote which part).
  world_.barrier();
  // A long CPU run reads its peak again, every rank at once, now that they have all stopped.
  int32_t reread = writer && peak_is_measured(o_) && since_run() >= kRereadAfterSeconds;  // rank 0 decides
  if (world_.size() > 1) world_.broadcast(&reread, 1, DType::i32, 0);
  double end_peak = 0;
  if (reread) {
    end_peak = calibrate_cpu_peak(threads, kPeakSeconds).flops;
    totals.set_end_peak(peak.flops, end_peak);
  }
  if (writer)
    export_checkpoint((fs::path(ckpt_opts_.dir) / checkpoint::step_dir_name(step_)).string(),
                      (out / "model.safetensors").string(), false);
  const MemStats& m = arena_.stats();
  std::fprintf(stderr, "[%s] peak memory: params %s, grads %s, optimizer %s, activations %s, comm %s\n",
               mesh_->str().c_str(), format_bytes(m.peak[0]).c_str(), format_bytes(m.peak[1]).c_str(),
               format_bytes(m.peak[2]).c_str(), format_bytes(m.peak[3]).c_str(), format_bytes(m.peak[4]).c_str());
  check_fault_fired();
  if (writer) {
    nlohmann::json record = {{"event", "end"}, {"step", step_}, {"seconds", since_run()}};
    if (end_peak > 0) record["peak_flops_per_rank_end"] = end_peak;  // the summary's MFU uses the faster reading
    log.write(record);
    totals.set_slowest_ranks(stragglers.slowest(3));
    std::fputs(totals.format(since_run(), run_outputs(o_.out_dir, ckpt_opts_.dir)).c_str(), stderr);
  }
  out_lock_ = DirLock();
  ckpt_lock_ = DirLock();
  return 0;
}

}  // namespace mt::train
