#include "train/plan.h"

#include <cmath>
#include <cstdio>

#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_sim.h"
#include "runtime/check.h"
#include "train/options.h"

namespace mt::train {
namespace {

// More time slots than this and the grid is left out (the figures are still printed).
constexpr size_t kMaxGridRows = 400;

parallel::ScheduleSpec parse_plan_args(const std::vector<std::string>& args) {
  parallel::ScheduleSpec spec;
  for (size_t i = 0; i < args.size(); i++) {
    std::string key = args[i], value;
    if (key.rfind("--", 0) == 0) {
      key = key.substr(2);
      const size_t eq = key.find('=');
      if (eq != std::string::npos) {
        value = key.substr(eq + 1);
        key = key.substr(0, eq);
      } else {
        if (i + 1 >= args.size()) fail("plan: flag --%s needs a value", key.c_str());
        value = args[++i];
      }
    } else {
      const size_t eq = key.find('=');
      if (eq == std::string::npos || eq == 0)
        fail("plan: unexpected argument '%s' (expected key=value: pp, grad_accum, pp.schedule, pp.virtual)", key.c_str());
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    if (key == "pp") spec.p = parse_int(key, value);
    else if (key == "grad_accum") spec.m = parse_int(key, value);
    else if (key == "pp.virtual") spec.v = parse_int(key, value);
    else if (key == "pp.schedule") spec.kind = parallel::parse_schedule_kind(value);
    else fail("plan: unknown option '%s' (expected pp, grad_accum, pp.schedule, pp.virtual)", key.c_str());
  }
  parallel::check_schedule_spec(spec);
  return spec;
}

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

}  // namespace

std::string plan_report(const std::vector<std::string>& args) {
  const parallel::ScheduleSpec spec = parse_plan_args(args);
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

int plan_main(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "-h" || a == "--help") {
      std::fputs("usage: minitrain plan pp=P grad_accum=M pp.schedule=gpipe|1f1b|interleaved|zb1 [pp.virtual=V]\n"
                 "  pp           int     pipeline stages (1)\n"
                 "  grad_accum   int     micro-batches per step (1)\n"
                 "  pp.schedule  string  gpipe | 1f1b | interleaved | zb1 (1f1b)\n"
                 "  pp.virtual   int     model chunks per rank, interleaved only (1)\n"
                 "Prints the schedule as a time x rank grid and its simulated bubble next to the formula.\n",
                 stdout);
      return 0;
    }
  const std::string report = plan_report(args);
  std::fwrite(report.data(), 1, report.size(), stdout);
  return 0;
}

}  // namespace mt::train
