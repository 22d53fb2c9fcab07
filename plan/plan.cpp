#include "plan/plan.h"

#include <cmath>
#include <cstdio>

#include "config/layout_rules.h"
#include "model/config.h"
#include "model/gpt.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_sim.h"
#include "plan/critical_batch.h"
#include "runtime/check.h"
#include "runtime/format.h"

namespace mt::plan {
namespace {

// More time slots than this and the grid is left out (the figures are still printed).
constexpr size_t kMaxGridRows = 400;

// The textbook bubble with F = B = W = 1, as fractions of the step and of the ideal time.
struct Formula {
  const char* of_step;
  const char* of_ideal;
};

Formula formula_text(const parallel::ScheduleSpec& s) {
  switch (s.kind) {
    case parallel::ScheduleKind::gpipe:
    case parallel::ScheduleKind::one_f_one_b: return {"(p-1)/(m+p-1)", "(p-1)/m"};
    case parallel::ScheduleKind::interleaved: return {"(p-1)/(v m+p-1)", "(p-1)/(v m)"};
    case parallel::ScheduleKind::zb1: return {"(p-1)/(3m+p-1)", "(p-1)/(3m)"};
  }
  return {"", ""};
}

std::string legend(const parallel::ScheduleSpec& s) {
  std::string out = "cells: F forward, ";
  out += s.kind == parallel::ScheduleKind::zb1 ? "B input gradient, W weight gradient" : "B backward (two slots: input and weight gradients)";
  out += ", then the micro-batch";
  if (s.v > 1) out += "; the model chunk first (1F3: chunk 1's forward of micro-batch 3)";
  return out + "; . idle\n";
}

// The pipeline part: the schedule as a time x rank grid, its bubble next to the formula, the peaks.
std::string pipeline_report(const parallel::ScheduleSpec& spec) {
  const parallel::Schedule schedule = parallel::build_schedule(spec);
  const parallel::PipelineCosts unit;  // F = B = W = 1 per micro-batch of a rank's model share
  const parallel::Simulation sim = parallel::simulate(schedule, unit);
  std::string out = strfmt("pipeline: pp.schedule=%s pp=%d grad_accum=%d pp.virtual=%d: stage = chunk x pp + rank, "
                           "%d stages\n",
                           parallel::schedule_kind_name(spec.kind), spec.p, spec.m, spec.v, schedule.stages());
  const double slot = 1.0 / spec.v;
  const size_t rows = size_t(std::llround(sim.makespan / slot));
  out += "costs per micro-batch of a rank's layers: F = B = W = 1";
  if (spec.v > 1) out += strfmt(" (a chunk's pass 1/%d); one row = %g", spec.v, slot);
  out += "\n";
  if (rows <= kMaxGridRows) {
    out += parallel::render_grid(schedule, sim, slot);
    out += legend(spec);
  } else {
    out += strfmt("grid: %zu time slots, more than %zu: not shown\n", rows, kMaxGridRows);
  }
  const double bubble = parallel::formula_bubble_time(spec, unit);
  const double ideal = spec.m * 3.0;
  const Formula f = formula_text(spec);
  if (std::isnan(bubble)) {
    out += strfmt("bubble of the step:  simulated %.4f  (no formula with grad_accum < pp)\n", sim.bubble_fraction());
    out += strfmt("bubble / ideal time: simulated %.4f\n", sim.bubble_over_ideal());
  } else {
    out += strfmt("bubble of the step:  simulated %.4f  formula %s = %.4f\n", sim.bubble_fraction(), f.of_step,
                  bubble / (ideal + bubble));
    out += strfmt("bubble / ideal time: simulated %.4f  formula %s = %.4f\n", sim.bubble_over_ideal(), f.of_ideal,
                  bubble / ideal);
  }
  out += "peak activations held, in micro-batches of a rank's layers:";
  for (int r = 0; r < spec.p; r++) out += strfmt(" r%d %g", r, sim.peak_activations(r));
  out += "\n";
  return out;
}

std::string si(double x, const char* unit) {
  const char* p[] = {"", "k", "M", "G", "T", "P", "E"};
  int k = 0;
  while (std::fabs(x) >= 1000 && k < 6) x /= 1000, k++;
  return strfmt("%.3g%s%s%s", x, k || *unit ? " " : "", p[k], unit);
}

std::string ms(double s) { return strfmt("%.3f ms", s * 1e3); }

std::string comm_line(const char* name, int size, const parallel::CommCounters& c) {
  std::string s = strfmt("  %-3s (%d ranks):", name, size);
  bool any = false;
  for (int op = 0; op < parallel::kNumCommOps; op++) {
    const parallel::CommOpCount& k = c[parallel::CommOp(op)];
    if (!k.calls && !k.sent_bytes) continue;
    s += strfmt(" %s %llu B (%llu calls);", parallel::comm_op_name(parallel::CommOp(op)),
                (unsigned long long)k.sent_bytes, (unsigned long long)k.calls);
    any = true;
  }
  if (!any) s += " nothing";
  return s + "\n";
}

}  // namespace

std::string memory_over(const MemoryPlan& m, const Hardware& hw) {
  const double total = double(m.total());
  if (total <= hw.memory_bytes) return "";
  size_t big = 0;
  for (size_t c = 1; c < m.bytes.size(); c++)
    if (m.bytes[c] > m.bytes[big]) big = c;
  // The category that alone would have to shrink by the excess, if one can; else the largest.
  const double excess = total - hw.memory_bytes;
  return strfmt("needs %s per rank, %s has %s: over by %s; %s is the largest category (%s, %.0f%% of it)%s",
                format_bytes(size_t(total)).c_str(), hw.name.c_str(), format_bytes(size_t(hw.memory_bytes)).c_str(),
                format_bytes(size_t(excess)).c_str(), mem_category_name(MemCategory(big)),
                format_bytes(m.bytes[big]).c_str(), 100.0 * double(m.bytes[big]) / total,
                double(m.bytes[big]) > excess ? "" : ", and shrinking it alone would not be enough");
}

PlanResult evaluate_plan(const config::TrainOptions& o, const parallel::MeshLayout& l, const Hardware& hw) {
  PlanResult r;
  r.layout = l;
  const PipelineFigures pipe = pipeline_figures(o, l);
  r.memory = plan_memory_worst(o, l, pipe);
  r.comm = plan_comm(o, l, r.memory.pp_rank);
  r.time = plan_time(o, l, hw, r.comm, r.memory, pipe);
  r.over = memory_over(r.memory, hw);
  return r;
}

nlohmann::json plan_json(const PlanRequest& r) {
  const config::TrainOptions& o = r.options;
  const PlanResult p = evaluate_plan(o, r.layout, r.hw);
  nlohmann::json mem = nlohmann::json::object();
  for (int c = 0; c < kNumMemCategories; c++) mem[mem_category_name(MemCategory(c))] = p.memory.bytes[size_t(c)];
  mem["nccl"] = p.memory.nccl;  // not an arena category: NCCL's buffers, an estimate (plan/memory.h)
  mem["total"] = p.memory.total();
  const TimePlan& t = p.time;
  nlohmann::json j = {
      {"model", o.model.to_json()},
      {"params", o.model.num_params()},
      {"active_params", o.model.num_active_params()},
      {"layout", {{"dp", r.layout.dp}, {"tp", r.layout.tp}, {"pp", r.layout.pp}, {"cp", r.layout.cp},
                  {"zero", o.parallel.zero}, {"sp", o.sequence_parallel()}, {"world", r.layout.world()},
                  {"name", parallel::layout_name(r.layout)}}},
      {"batch_size", o.batch_size}, {"seq_len", o.seq_len}, {"grad_accum", o.grad_accum},
      {"precision", o.to_json()["precision"]}, {"recompute", model::recompute_name(o.recompute)},
      {"attention", model::attention_name(o.attention_kind())}, {"device", device_name(o.device)},
      {"hardware", r.hw.to_json()},
      {"memory", mem},
      {"memory_rank", {{"pp_rank", p.memory.pp_rank}, {"in_flight_micro_batches", p.memory.in_flight},
                       {"activations_per_micro_batch", p.memory.stash_per_micro},
                       {"activation_workspace", p.memory.workspace},
                       {"grads_least", p.memory.grads_least}, {"grads_bound", p.memory.grads_bound}}},
      {"fits", p.over.empty()},
      {"flops_per_token", t.flops_per_token},
      {"hw_flops_per_token", t.hw_flops_per_token},
      {"tokens_per_step", t.tokens_per_step},
      {"flops_per_step", t.flops_per_token * t.tokens_per_step},
      {"comm", {{"dp", parallel::counters_json(p.comm.dp)}, {"tp", parallel::counters_json(p.comm.tp)}, {"cp", parallel::counters_json(p.comm.cp)},
                {"pp", parallel::counters_json(p.comm.pp)}, {"ep", parallel::counters_json(p.comm.ep)}}},
      {"time", {{"gemm_s", t.gemm_s}, {"attention_s", t.attention_s}, {"memory_bound_s", t.memory_s},
                {"optimizer_s", t.optimizer_s}, {"grad_passes_s", t.grad_passes_s},
                {"tp_s", t.tp_s}, {"cp_s", t.cp_s}, {"pp_s", t.pp_s}, {"dp_s", t.dp_s}, {"ep_s", t.ep_s},
                {"dp_exposed_s", t.dp_exposed_s}, {"bubble_over_ideal", t.bubble}, {"step_s", t.step_s}}},
      {"tokens_per_s", t.tokens_per_s()},
      {"mfu", t.mfu},
  };
  if (r.noise_tokens > 0) {
    const CriticalBatch cb{r.noise_tokens, t.tokens_per_step};
    j["critical_batch"] = {{"noise_scale_tokens", cb.noise_tokens}, {"batch_tokens", cb.batch_tokens},
                           {"below", cb.below()}, {"steps_factor_when_doubled", cb.steps_factor_when_doubled()},
                           {"tokens_factor_when_doubled", cb.tokens_factor_when_doubled()}};
  }
  if (r.layout.pp > 1) {
    const parallel::ScheduleSpec spec = config::pipeline_spec(o);
    const parallel::Simulation sim = parallel::simulate(parallel::build_schedule(spec), parallel::PipelineCosts());
    std::vector<double> peaks;
    for (int k = 0; k < spec.p; k++) peaks.push_back(sim.peak_activations(k));
    j["pipeline"] = {{"schedule", parallel::schedule_kind_name(spec.kind)}, {"pp", spec.p}, {"grad_accum", spec.m},
                     {"virtual", spec.v}, {"bubble_fraction", sim.bubble_fraction()},
                     {"bubble_over_ideal", sim.bubble_over_ideal()}, {"peak_micro_batches", peaks}};
  }
  if (!p.over.empty()) j["over"] = p.over;
  if (r.tokens > 0) {
    const double steps = std::ceil(r.tokens / t.tokens_per_step), wall = steps * t.step_s;
    j["budget"] = {{"tokens", r.tokens}, {"steps", steps}, {"wall_s", wall},
                   {"chip_hours", wall * r.layout.world() / 3600.0}};
  }
  return j;
}

std::string plan_report(const std::vector<std::string>& args) {
  const PlanRequest r = parse_plan_request(args);
  if (r.search) return plan_search(r);
  if (r.json) return plan_json(r).dump(2) + "\n";
  const config::TrainOptions& o = r.options;
  const parallel::MeshLayout& l = r.layout;
  const PlanResult p = evaluate_plan(o, l, r.hw);
  const TimePlan& t = p.time;
  const model::GPTConfig& m = o.model;
  std::string s;
  s += strfmt("model: %s, %s parameters (%s active per token), %s FLOPs per token (6 N_matmul + 12 L C T at T = %d), "
              "%s with recompute=%s\n",
              o.model_preset.c_str(), si(double(m.num_params()), "").c_str(), si(double(m.num_active_params()), "").c_str(),
              si(t.flops_per_token, "").c_str(), o.seq_len, si(t.hw_flops_per_token, "").c_str(),
              model::recompute_name(o.recompute));
  const std::string experts =  // expert parallelism: where the routed experts are stored and reduced
      l.ep > 1 && o.model.moe.enabled()
          ? strfmt(", ep=%d (%d of %d experts per rank, reduced over %d ranks)", l.ep, o.model.moe.experts / l.ep,
                   o.model.moe.experts, l.dp * l.cp / l.ep)
          : std::string();
  s += strfmt("layout: %s%s on %d x %s, zero=%d, precision=%s, sp=%s, attention=%s (%s path)\n", parallel::layout_name(l).c_str(),
              experts.c_str(), l.world(), r.hw.name.c_str(), o.parallel.zero, o.to_json()["precision"].get<std::string>().c_str(),
              o.sequence_parallel() ? "on" : "off", model::attention_name(o.attention_kind()), device_name(o.device));
  s += strfmt("batch: %d rows x %d tokens x grad_accum %d x dp %d = %s tokens per step, %s FLOPs per step\n",
              o.batch_size, o.seq_len, o.grad_accum, l.dp, si(t.tokens_per_step, "").c_str(),
              si(t.flops_per_token * t.tokens_per_step, "").c_str());
  if (r.noise_tokens > 0)
    s += "critical batch: " + CriticalBatch{r.noise_tokens, t.tokens_per_step}.note() + "\n";
  s += strfmt("memory per rank (pipeline rank %d, peak of a step; metrics.jsonl `memory` names):\n", p.memory.pp_rank);
  for (int c = 0; c < kNumMemCategories; c++) {
    if (MemCategory(c) == MemCategory::other) continue;
    s += strfmt("  %-12s %12llu B  %s", mem_category_name(MemCategory(c)), (unsigned long long)p.memory.bytes[size_t(c)],
                format_bytes(p.memory.bytes[size_t(c)]).c_str());
    if (MemCategory(c) == MemCategory::grads && o.parallel.zero >= 2)
      s += strfmt("  (unit buffers in flight: %s if every reduction completes at once, %s at the bound of two)",
                  format_bytes(p.memory.grads_least).c_str(), format_bytes(p.memory.grads_bound).c_str());
    if (MemCategory(c) == MemCategory::activations)
      s += strfmt("  (%g micro-batches in flight x %s kept, + %s workspace)", p.memory.in_flight,
                  format_bytes(p.memory.stash_per_micro).c_str(), format_bytes(p.memory.workspace).c_str());
    if (MemCategory(c) == MemCategory::activations && p.memory.split_stash)
      s += strfmt("; zb1: %s while waiting for its W, the peak taken over the schedule's actions",
                  format_bytes(p.memory.split_stash).c_str());
    s += "\n";
  }
  if (p.memory.nccl) {
    const NcclConnections n = plan_nccl_connections(o, r.layout, p.memory.pp_rank);
    const NcclAssumption a;
    s += strfmt("  %-12s %12llu B  %s  (estimate: %d collective and %d point-to-point connections x %d channels x "
                "%s NCCL_BUFFSIZE, outside the memory pool)\n",
                "nccl", (unsigned long long)p.memory.nccl, format_bytes(p.memory.nccl).c_str(), n.rings, n.peers,
                a.channels, format_bytes(a.buff_bytes).c_str());
  }
  s += strfmt("  %-12s %12llu B  %s of %s: %s\n", "total", (unsigned long long)p.memory.total(),
              format_bytes(p.memory.total()).c_str(), format_bytes(size_t(r.hw.memory_bytes)).c_str(),
              p.over.empty() ? "fits" : ("does not fit: " + p.over).c_str());
  s += "communication per step (bytes this rank sends, ring/pairwise algorithms):\n";
  s += comm_line("dp", l.dp * l.cp, p.comm.dp) + comm_line("tp", l.tp, p.comm.tp) + comm_line("cp", l.cp, p.comm.cp) +
       comm_line("pp", l.pp, p.comm.pp);
  if (l.ep > 1)
    s += comm_line("ep", l.ep, p.comm.ep) + "      (the token all-to-alls for balanced routing, no drops)\n";
  if (l.pp > 1) s += pipeline_report(config::pipeline_spec(o));
  s += strfmt("time per step on %s (%s):\n", r.hw.name.c_str(), r.hw.source.c_str());
  const bool flash = o.attention_kind() == model::Attention::flash;
  s += strfmt("  compute   GEMMs %s at %s, attention %s at %s, memory-bound ops %s at %s\n", ms(t.gemm_s).c_str(),
              si(r.hw.flops_for(o.precision), "FLOP/s").c_str(), ms(t.attention_s).c_str(),
              si(r.hw.attention_flops_for(flash, o.precision), "FLOP/s").c_str(), ms(t.memory_s).c_str(),
              si(r.hw.memory_bytes_per_s, "B/s").c_str());
  s += strfmt("  update    optimizer %s at %s, gradient passes (zeroing, norms) %s at %s\n", ms(t.optimizer_s).c_str(),
              si(r.hw.optimizer_rate(), "B/s").c_str(), ms(t.grad_passes_s).c_str(),
              si(r.hw.reduction_rate(), "B/s").c_str());
  if (l.ep > 1) s += strfmt("  comm      ep %s (the token exchange, not overlapped)\n", ms(t.ep_s).c_str());
  s += strfmt("  comm      tp %s, cp %s, pp %s, dp %s (%s exposed)\n", ms(t.tp_s).c_str(), ms(t.cp_s).c_str(),
              ms(t.pp_s).c_str(), ms(t.dp_s).c_str(), ms(t.dp_exposed_s).c_str());
  s += strfmt("  step      %s (pipeline bubble %.4f of the ideal time), %s tokens/s, MFU %.1f%%\n", ms(t.step_s).c_str(),
              t.bubble, si(t.tokens_per_s(), "").c_str(), 100.0 * t.mfu);
  if (r.tokens > 0) {
    const double steps = std::ceil(r.tokens / t.tokens_per_step), wall = steps * t.step_s;
    s += strfmt("budget: %s tokens = %.0f steps, %s wall-clock, %.1f chip-hours on %d chips\n", si(r.tokens, "").c_str(),
                steps, format_duration(wall).c_str(), wall * l.world() / 3600.0, l.world());
  }
  return s;
}

}  // namespace mt::plan
