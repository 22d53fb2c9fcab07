// `minitrain plan`: sizing arithmetic before a run, for this machine or one the project does not have.
//
//   minitrain plan [train options ...] [hw=h100|h200|a100|cpu|FILE] [gpus=N] [tokens=N] [--json]
//   minitrain plan --search gpus=N [model and batch options ...] [hw=...] [top=K]
//
// It takes every option of `minitrain train` (parsed and validated by the trainer's own parser:
// model, layout, ZeRO, precision, recompute, batch, schedule) and reports for one rank: memory by
// arena category (plan/memory.h), FLOPs per token and per step, bytes per step on each group
// and the predicted step time and MFU (plan/cost.h), the pipeline schedule as a time x rank
// grid with its simulated bubble next to the papers' formula (parallel/pipeline_sim.h), and for a
// token budget the wall-clock time and chip-hours. --search ranks the layouts that fit (train/
// plan_search.cpp). Hardware: plan/hardware.h.
//
// The grid costs one unit per micro-batch for each of F, B (input gradient) and W (weight gradient)
// of a rank's whole model share, so a whole backward takes two units and a chunk's pass 1/v.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/options.h"
#include "plan/cost.h"
#include "plan/hardware.h"
#include "plan/memory.h"

namespace mt::plan {

struct PlanRequest {
  config::TrainOptions options;  // validated by the trainer's rules; device set to what the hardware runs
  parallel::MeshLayout layout{.dp = 1};  // dp resolved (from gpus= or dp=)
  Hardware hw;
  double tokens = 0;  // token budget (0: none)
  double noise_tokens = 0;  // a gradient noise scale B_simple in tokens (noise_scale= or noise_from=; 0: none)
  bool json = false, search = false;
  int top = 5;        // --search: layouts shown in full
  int gpus = 0;       // gpus=N as given (0: the layout's product)
  int64_t global_rows = 0;  // --search with global_batch: the rows per step every layout keeps (0: B x accum x dp)
};
// Parses plan's arguments: the trainer's options plus hw=, gpus=, tokens=, top=, noise_scale=,
// noise_from=, --json, --search.
// Throws one line naming the option on bad input.
PlanRequest parse_plan_request(const std::vector<std::string>& args);

// Everything the planner says of one layout.
struct PlanResult {
  parallel::MeshLayout layout;
  MemoryPlan memory;
  CommPlan comm;
  TimePlan time;
  std::string over;  // "" when the layout fits the hardware's memory; else which category, by how much
};
PlanResult evaluate_plan(const config::TrainOptions& o, const parallel::MeshLayout& l, const Hardware& hw);
// Why `m` does not fit `hw`'s memory ("" if it does): the total against the capacity, the amount
// over, and the category that takes the most.
std::string memory_over(const MemoryPlan& m, const Hardware& hw);

// The report (text) and the same as one JSON object.
std::string plan_report(const std::vector<std::string>& args);
nlohmann::json plan_json(const PlanRequest& r);
// --search's ranking (plan/search.cpp). It tries every mesh of r.gpus chips (tp x cp x pp x dp) with
// one or two micro-batch sizes, each ZeRO stage and each recompute mode, and refuses with one line a
// search of more than kMaxSearchLayouts layouts (gpus=720720 has over a million; 2^20, the most gpus
// plan takes, at most 42504).
// `progress.report` is called with the layouts tried and their total every `progress.every_s`
// seconds while it runs (plan_main prints it on stderr).
constexpr size_t kMaxSearchLayouts = 100000;
struct SearchProgress {
  double every_s = 1;
  std::function<void(size_t tried, size_t total)> report;
};
std::string plan_search(const PlanRequest& r, const SearchProgress& progress = {});

// Prints the report (or JSON, or the search) to stdout; a layout that does not fit also prints one
// error line to stderr, as does a refused request (bad options, values beyond config/limits.h): both
// return 2 (kExitRefused, runtime/exit_status.h).
int plan_main(const std::vector<std::string>& args);

}  // namespace mt::plan
