// What rank 0 prints around a run: at the start a short plan (model, layout, batch, precision,
// outputs), at the end a summary table (steps, tokens, times, losses, throughput, time split, peak
// memory, checkpoints) and the path of every output. Pure formatting of figures the trainer hands
// over, so the tests give fixed figures and read the text.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/arena.h"

namespace mt::train {
struct StepResult;
}  // namespace mt::train
namespace mt::config {
struct TrainOptions;
}  // namespace mt::config
namespace mt::plan {
struct Peak;
}  // namespace mt::plan
namespace mt::parallel {
class Mesh;
}  // namespace mt::parallel
namespace mt::train {

struct RunPlan {
  std::string model;            // preset name
  int64_t params = 0;
  int64_t active_params = 0;    // used per token (a mixture of experts: top_k of its experts); 0: = params
  double flops_per_token = 0;   // model FLOPs (6N + attention)
  int tp = 1, cp = 1, pp = 1, dp = 1;
  int ep = 1;  // expert parallelism, carved from dp x cp (shown after the layout when > 1)
  int zero = 0;
  int batch_size = 0, grad_accum = 1, seq_len = 0;  // per data-parallel rank
  int first_step = 0, steps = 0;                    // starts after first_step, ends at steps
  std::string precision, recompute, attention, device;
  std::string data;             // data.path or data.mix
  uint64_t data_tokens = 0;     // tokens in the training data (0: endless, synthetic)
  uint64_t data_docs = 0;       // documents in it (0: not known)
  std::array<size_t, kNumMemCategories> memory{};  // rank 0's memory allocated before the first step
  std::array<uint64_t, kNumMemCategories> expected{};  // the planner's per-step peak on rank 0 (0s: none)
  uint64_t expected_nccl = 0;  // and its estimate of NCCL's connection buffers there (device runs)
  double peak_flops = 0;        // per rank, for MFU
  std::string peak_label;
  std::string out_dir, ckpt_dir;

  int64_t global_rows() const { return int64_t(batch_size) * grad_accum * dp; }
  int64_t global_tokens() const { return global_rows() * seq_len; }
};

std::string format_run_plan(const RunPlan& p);

// The plan of a run from its resolved options (batch_size after global_batch), mesh and MFU peak.
RunPlan make_run_plan(const config::TrainOptions& o, const parallel::Mesh& mesh, const plan::Peak& peak, double flops_per_token,
                      int first_step, const std::string& ckpt_dir, uint64_t data_tokens, const MemStats& before);
// Every file and directory a run leaves: metrics, config, checkpoints, the latest pointer, weights.
std::vector<std::pair<std::string, std::string>> run_outputs(const std::string& out_dir, const std::string& ckpt_dir);

// What the earlier attempts of a resumed run cost: read from metrics.jsonl before this attempt
// appends to it. Each attempt starts with an {"event": "start", "resumed_at": S} record; the step
// records an attempt wrote past the step the next attempt resumed at were lost with it and run
// again (a run continued on purpose, from its last step, loses none).
struct ResumeHistory {
  int earlier_attempts = 0;  // attempts before this one
  int redone_steps = 0;      // step records lost with the attempt that wrote them
  double redone_s = 0;       // their step time (time.total)
};
// `jsonl`: the file's text (a torn last line is ignored); `resumed_at`: this attempt's first step - 1.
ResumeHistory resume_history(const std::string& jsonl, int resumed_at);

// Sums over the steps of a run (the steps this process ran; a resumed run counts from its resume).
class RunTotals {
 public:
  void add_step(int step, const StepResult& r, double mfu, double hfu, const MemStats& m);
  void add_val_loss(double v) { val_loss_ = v, has_val_ = true; }
  void add_checkpoint(int64_t step);  // once per checkpoint saved (repeats ignored)
  void set_history(const ResumeHistory& h) { history_ = h; }
  // The last gradient noise scale and the global batch, both in tokens: a "critical batch" row.
  void set_noise_scale(double noise_tokens, double batch_tokens) { noise_tokens_ = noise_tokens, batch_tokens_ = batch_tokens; }
  // The slowest ranks by busy time (train/stragglers.h StragglerTally::slowest; "": no row).
  void set_slowest_ranks(std::string s) { slowest_ = std::move(s); }
  // The peak read at the start (what each step's MFU used) and again at the end, per rank: the MFU and
  // HFU row then take the faster of the two, and names both.
  void set_end_peak(double start_flops, double end_flops) { start_peak_ = start_flops, end_peak_ = end_flops; }

  int steps() const { return steps_; }
  int64_t tokens() const { return tokens_; }
  const std::array<size_t, kNumMemCategories>& peak() const { return peak_; }
  const std::vector<int64_t>& checkpoints() const { return ckpts_; }

  // The table, with `wall_s` the run's wall time; then "outputs:" and one `name  path` per output.
  std::string format(double wall_s, const std::vector<std::pair<std::string, std::string>>& outputs) const;

 private:
  int steps_ = 0, first_ = -1, last_ = -1, skipped_ = 0;
  int64_t tokens_ = 0;
  double loss_ = 0, val_loss_ = 0;
  bool has_val_ = false;
  double t_total_ = 0, t_data_ = 0, t_forward_ = 0, t_backward_ = 0, t_grad_wait_ = 0, t_optimizer_ = 0;
  double mfu_time_ = 0, hfu_time_ = 0;  // sum of mfu x step time (a time-weighted mean)
  std::array<size_t, kNumMemCategories> peak_{};
  std::vector<int64_t> ckpts_;
  ResumeHistory history_;
  double noise_tokens_ = 0, batch_tokens_ = 0;
  std::string slowest_;
  double start_peak_ = 0, end_peak_ = 0;
};

}  // namespace mt::train
