#include "train/run_summary.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "plan/critical_batch.h"
#include "runtime/check.h"
#include "runtime/format.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace mt::train {

std::string format_run_plan(const RunPlan& p) {
  const int world = p.tp * p.cp * p.pp * p.dp;
  std::string s = "minitrain: plan\n";
  const std::string active = p.active_params > 0 && p.active_params != p.params
                                 ? strfmt(" (%s active per token)", format_count(double(p.active_params)).c_str())
                                 : "";
  s += strfmt("  model      %s: %s parameters%s, %s FLOPs per token (forward + backward)\n", p.model.c_str(),
              format_count(double(p.params)).c_str(), active.c_str(), format_count(p.flops_per_token).c_str());
  const std::string ep = p.ep > 1 ? strfmt(" with EP(%d)", p.ep) : "";
  s += strfmt("  layout     %s%s on %d rank%s, ZeRO-%d, device %s\n", parallel::layout_name({.dp = p.dp, .pp = p.pp, .cp = p.cp, .tp = p.tp}).c_str(),
              ep.c_str(), world, world == 1 ? "" : "s", p.zero, p.device.c_str());
  s += strfmt("  batch      %lld rows x %d tokens = %s tokens per step (batch_size %d x grad_accum %d x dp %d)\n",
              (long long)p.global_rows(), p.seq_len, format_count(double(p.global_tokens())).c_str(), p.batch_size,
              p.grad_accum, p.dp);
  s += strfmt("  steps      %d to %d: %s tokens, %s FLOPs\n", p.first_step + 1, p.steps,
              format_count(double(p.global_tokens()) * (p.steps - p.first_step)).c_str(),
              format_count(p.flops_per_token * double(p.global_tokens()) * (p.steps - p.first_step)).c_str());
  const double run_tokens = double(p.global_tokens()) * (p.steps - p.first_step);
  if (p.data_tokens > 0)
    s += strfmt("  data       %s: %s tokens%s; these steps read %.2f epochs of it\n", p.data.c_str(),
                format_count(double(p.data_tokens)).c_str(),
                p.data_docs ? strfmt(" in %s documents", format_count(double(p.data_docs)).c_str()).c_str() : "",
                run_tokens / double(p.data_tokens));
  else
    s += strfmt("  data       %s\n", p.data.empty() ? "(none)" : p.data.c_str());
  s += strfmt("  precision  %s, recompute %s, attention %s\n", p.precision.c_str(), p.recompute.c_str(),
              p.attention.c_str());
  std::string mem;
  for (int c = 0; c < kNumMemCategories; c++)
    if (p.memory[c]) mem += strfmt("%s%s %s", mem.empty() ? "" : ", ", mem_category_name(MemCategory(c)), format_bytes(p.memory[c]).c_str());
  if (!mem.empty()) s += strfmt("  memory     %s on rank 0 before the first step (activations come with it)\n", mem.c_str());
  std::string expected;
  uint64_t expected_total = 0;
  for (int c = 0; c < kNumMemCategories; c++) {
    expected_total += p.expected[size_t(c)];
    if (p.expected[size_t(c)])
      expected += strfmt("%s%s %s", expected.empty() ? "" : ", ", mem_category_name(MemCategory(c)),
                         format_bytes(size_t(p.expected[size_t(c)])).c_str());
  }
  if (p.expected_nccl) {  // outside the pool and the arena, held from start-up (an estimate, plan/memory.h)
    expected_total += p.expected_nccl;
    expected += strfmt(", nccl %s (estimate)", format_bytes(size_t(p.expected_nccl)).c_str());
  }
  if (!expected.empty())
    s += strfmt("  expected   peak per step on rank 0: %s; %s in all (minitrain plan's model)\n", expected.c_str(),
                format_bytes(size_t(expected_total)).c_str());
  s += strfmt("  MFU peak   %s FLOP/s per rank (%s)\n", format_count(p.peak_flops).c_str(), p.peak_label.c_str());
  s += strfmt("  outputs    %s (checkpoints in %s)\n", p.out_dir.c_str(), p.ckpt_dir.c_str());
  return s;
}

RunPlan make_run_plan(const config::TrainOptions& o, const parallel::Mesh& mesh, const plan::Peak& peak, double flops_per_token,
                      int first_step, const std::string& ckpt_dir, uint64_t data_tokens, const MemStats& before) {
  RunPlan p;
  p.model = o.model_preset;
  p.params = o.model.num_params();
  p.active_params = o.model.num_active_params();
  p.flops_per_token = flops_per_token;
  p.tp = mesh.tp(), p.cp = mesh.cp(), p.pp = mesh.pp(), p.dp = mesh.dp();
  p.ep = mesh.ep();
  p.zero = o.parallel.zero;
  p.batch_size = o.batch_size, p.grad_accum = o.grad_accum, p.seq_len = o.seq_len;
  p.first_step = first_step, p.steps = o.steps;
  p.precision = o.to_json()["precision"].get<std::string>();
  p.recompute = model::recompute_name(o.recompute);
  p.attention = model::attention_name(o.attention_kind());
  p.device = device_name(o.device);
  p.data = o.data.mix.empty() ? o.data.path : "mix " + o.data.mix;
  p.data_tokens = data_tokens;
  p.memory = before.live;
  p.peak_flops = peak.flops, p.peak_label = peak.label;
  p.out_dir = o.out_dir, p.ckpt_dir = ckpt_dir;
  return p;
}

std::vector<std::pair<std::string, std::string>> run_outputs(const std::string& out_dir, const std::string& ckpt_dir) {
  const std::filesystem::path out(out_dir);
  return {{"metrics", (out / "metrics.jsonl").string()},
          {"config", (out / "config.json").string()},
          {"checkpoints", ckpt_dir},
          {"latest", (std::filesystem::path(ckpt_dir) / "latest").string()},
          {"weights (HF)", (out / "model.safetensors").string()}};
}

void RunTotals::add_step(int step, const StepResult& r, double mfu, double hfu, const MemStats& m) {
  if (first_ < 0) first_ = step;
  last_ = step;
  steps_++;
  skipped_ += r.skipped;
  tokens_ += r.tokens;
  loss_ = r.loss;
  t_total_ += r.t_total;
  t_data_ += r.t_data;
  t_forward_ += r.t_forward;
  t_backward_ += r.t_backward;
  t_grad_wait_ += r.t_grad_wait;
  t_optimizer_ += r.t_optimizer;
  mfu_time_ += mfu * r.t_total;
  hfu_time_ += hfu * r.t_total;
  for (int c = 0; c < kNumMemCategories; c++) peak_[c] = std::max(peak_[c], m.peak[c]);
}

void RunTotals::add_checkpoint(int64_t step) {
  if (std::find(ckpts_.begin(), ckpts_.end(), step) == ckpts_.end()) ckpts_.push_back(step);
}

ResumeHistory resume_history(const std::string& jsonl, int resumed_at) {
  // Per attempt: where it resumed, and its step records (step, time).
  struct Attempt {
    std::vector<std::pair<int64_t, double>> steps;
  };
  std::vector<Attempt> attempts;
  std::vector<int64_t> starts;  // resumed_at of each attempt, then this one's
  size_t pos = 0;
  while (pos < jsonl.size()) {
    const size_t end = jsonl.find('\n', pos);
    if (end == std::string::npos) break;  // a torn last line: not a record
    const nlohmann::json j = nlohmann::json::parse(jsonl.begin() + long(pos), jsonl.begin() + long(end), nullptr, false);
    pos = end + 1;
    if (j.is_discarded() || !j.is_object()) continue;
    if (j.value("event", "") == "start") {
      attempts.emplace_back();
      starts.push_back(j.value("resumed_at", int64_t(0)));
    } else if (j.contains("loss") && j.contains("step") && !attempts.empty()) {
      const double t = j.contains("time") ? j["time"].value("total", 0.0) : 0.0;
      attempts.back().steps.push_back({j["step"].get<int64_t>(), t});
    }
  }
  starts.push_back(resumed_at);
  ResumeHistory h;
  h.earlier_attempts = int(attempts.size());
  for (size_t a = 0; a < attempts.size(); a++)
    for (const auto& [step, t] : attempts[a].steps)
      if (step > starts[a + 1]) {
        h.redone_steps++;
        h.redone_s += t;
      }
  return h;
}

std::string RunTotals::format(double wall_s, const std::vector<std::pair<std::string, std::string>>& outputs) const {
  auto row = [](const char* name, const std::string& value) { return strfmt("  %-18s %s\n", name, value.c_str()); };
  auto pct = [&](double t) { return t_total_ > 0 ? 100 * t / t_total_ : 0.0; };
  std::string s = "minitrain: summary\n";
  s += row("steps", steps_ ? strfmt("%d (%d to %d), %d skipped", steps_, first_, last_, skipped_) : "0");
  s += row("tokens", format_count(double(tokens_)));
  s += row("wall time", strfmt("%s (%.1f s; steps %.1f s)", format_duration(wall_s).c_str(), wall_s, t_total_));
  s += row("train loss", steps_ ? strfmt("%.4f (last step)", loss_) : "-");
  s += row("val loss", has_val_ ? strfmt("%.4f (last evaluation)", val_loss_) : "- (eval_every=0 or no val data)");
  s += row("tokens/s", t_total_ > 0 ? strfmt("%.0f", tokens_ / t_total_) : "-");
  std::string mfu = "-";
  if (t_total_ > 0) {
    // The steps' figures are against the start's peak; a faster reading at the end scales them down.
    const bool reread = start_peak_ > 0 && end_peak_ > 0;
    const double scale = reread && end_peak_ > start_peak_ ? start_peak_ / end_peak_ : 1.0;
    mfu = strfmt("%.1f%% / %.1f%%", 100 * scale * mfu_time_ / t_total_, 100 * scale * hfu_time_ / t_total_);
    if (reread)
      mfu += strfmt(" (peak per rank read at the start, %s, and at the end, %s FLOP/s: the faster kept)",
                    format_count(start_peak_).c_str(), format_count(end_peak_).c_str());
  }
  s += row("MFU / HFU", mfu);
  const double other = std::max(0.0, t_total_ - t_data_ - t_forward_ - t_backward_ - t_grad_wait_ - t_optimizer_);
  s += row("time split", strfmt("data %.0f%%, forward %.0f%%, backward %.0f%%, grad wait %.0f%%, optimizer %.0f%%, other %.0f%%",
                                pct(t_data_), pct(t_forward_), pct(t_backward_), pct(t_grad_wait_), pct(t_optimizer_),
                                pct(other)));
  std::string mem;
  for (int c = 0; c < kNumMemCategories; c++)
    mem += strfmt("%s%s %s", c ? ", " : "", mem_category_name(MemCategory(c)), format_bytes(peak_[c]).c_str());
  s += row("peak memory", mem + " (rank 0)");
  std::string ck;
  for (size_t i = 0; i < ckpts_.size(); i++) ck += strfmt("%s%lld", i ? ", " : "", (long long)ckpts_[i]);
  s += row("checkpoints", ckpts_.empty() ? "none" : strfmt("%zu, at step %s", ckpts_.size(), ck.c_str()));
  const ResumeHistory& h = history_;
  if (noise_tokens_ > 0)
    s += row("critical batch", plan::CriticalBatch{noise_tokens_, batch_tokens_}.note());
  if (!slowest_.empty()) s += row("slowest ranks", slowest_ + " (busy time / median)");
  s += row("restarts", h.earlier_attempts == 0
                           ? std::string("none (one attempt)")
                           : strfmt("%d earlier attempt(s); %d step(s) lost and run again (%.1f s of step time)",
                                    h.earlier_attempts, h.redone_steps, h.redone_s));
  s += "minitrain: outputs\n";
  for (const auto& [name, path] : outputs) s += row(name.c_str(), path);
  return s;
}

}  // namespace mt::train
