// The `minitrain plan` command: its arguments (the trainer's options plus the planner's own) and
// what it prints; the arithmetic is plan/plan.h's.
#include <algorithm>
#include <cstdio>

#include "config/limits.h"
#include "plan/critical_batch.h"
#include "plan/plan.h"
#include "runtime/check.h"
#include "runtime/exit_status.h"

namespace mt::plan {
namespace {

// A token budget or noise scale beyond this (a million times the largest training sets) is refused:
// the steps and hours it gives would print as numbers of hundreds of digits.
constexpr double kMaxTokens = 1e18;

// Splits `key=value` / `--key value` / `--key=value`; returns false for a bare flag.
bool split_arg(const std::vector<std::string>& args, size_t& i, std::string& key, std::string& value) {
  std::string a = args[i];
  if (a.rfind("--", 0) == 0) a = a.substr(2);
  const size_t eq = a.find('=');
  if (eq != std::string::npos) {
    key = a.substr(0, eq);
    value = a.substr(eq + 1);
    return true;
  }
  key = a;
  if (args[i].rfind("--", 0) != 0) return false;
  if (i + 1 >= args.size()) return false;
  value = args[++i];
  return true;
}

}  // namespace

PlanRequest parse_plan_request(const std::vector<std::string>& args) {
  PlanRequest r;
  std::vector<std::string> rest;
  std::string hw = "cpu";
  int gpus = 0;
  bool device_given = false, gpus_given = false;
  for (size_t i = 0; i < args.size(); i++) {
    if (args[i] == "--json") {
      r.json = true;
      continue;
    }
    if (args[i] == "--search") {
      r.search = true;
      continue;
    }
    size_t j = i;
    std::string key, value;
    if (split_arg(args, j, key, value) && (key == "hw" || key == "gpus" || key == "tokens" || key == "top" ||
                                           key == "noise_scale" || key == "noise_from")) {
      i = j;
      if (key == "hw") hw = value;
      else if (key == "gpus") gpus = config::parse_int("gpus", value), gpus_given = true;
      else if (key == "top") r.top = config::parse_int("top", value);
      else if (key == "noise_scale") r.noise_tokens = config::parse_number("noise_scale", value);
      else if (key == "noise_from") r.noise_tokens = logged_noise_scale(value);
      else r.tokens = config::parse_number("tokens", value);
      if (key == "noise_scale" && !(r.noise_tokens > 0))
        fail("noise_scale (B_simple, in tokens) must be positive (got %s)", value.c_str());
      continue;
    }
    if (key == "device") device_given = true;
    rest.push_back(args[i]);
  }
  if ((gpus_given || r.search) && gpus < 1) fail("gpus must be positive%s (got %d)", r.search ? " with --search" : "", gpus);
  if (gpus > config::kMaxRanks)
    fail("gpus=%d is beyond what minitrain's arithmetic holds: at most %lld (2^20)", gpus,
         (long long)config::kMaxRanks);
  if (r.tokens < 0) fail("tokens must not be negative (got %g)", r.tokens);
  if (r.tokens > kMaxTokens) fail("tokens=%g is beyond what the budget's arithmetic holds: at most %g", r.tokens, kMaxTokens);
  if (r.noise_tokens > kMaxTokens)
    fail("noise_scale=%g is beyond what the critical batch's arithmetic holds: at most %g tokens", r.noise_tokens,
         kMaxTokens);
  if (r.top < 1) fail("top must be at least 1 (got %d)", r.top);
  r.hw = resolve_hardware(hw);
  config::TrainOptions o = config::parse_train_options(rest);  // the trainer's parser and validation
  parallel::MeshLayout& l = r.layout;
  l.tp = o.parallel.tp;
  l.pp = o.parallel.pp;
  l.cp = o.parallel.cp;
  l.ep = o.parallel.ep;
  const int model_ranks = l.tp * l.pp * l.cp;
  if (o.parallel.dp > 0) {
    l.dp = o.parallel.dp;
    if (gpus > 0 && gpus != l.dp * model_ranks && !r.search)
      fail("gpus=%d but dp %d x tp %d x pp %d x cp %d = %d", gpus, l.dp, l.tp, l.pp, l.cp, l.dp * model_ranks);
  } else if (gpus > 0) {
    if (gpus % model_ranks != 0 && !r.search)
      fail("gpus=%d is not divisible by tp %d x pp %d x cp %d = %d", gpus, l.tp, l.pp, l.cp, model_ranks);
    l.dp = std::max(1, gpus / model_ranks);
  }
  if (!r.search && (l.dp * l.cp) % l.ep != 0)
    fail("--ep %d does not divide dp %d x cp %d = %d: expert parallelism is carved from the data-parallel ranks", l.ep,
         l.dp, l.cp, l.dp * l.cp);
  if (o.global_batch > 0 && r.search) {
    // Each layout of the search sizes its own micro-batch from the global batch.
    r.global_rows = o.global_batch;
    o.batch_size = std::max(1, o.global_batch / std::max(1, l.dp * o.grad_accum));
  } else if (o.global_batch > 0) {
    const int per_step = l.dp * o.grad_accum;
    if (o.global_batch % per_step != 0)
      fail("global_batch %d is not divisible by dp %d x grad_accum %d", o.global_batch, l.dp, o.grad_accum);
    o.batch_size = o.global_batch / per_step;
    if (o.sequence_parallel() && (int64_t(o.batch_size) * o.seq_len) % l.tp != 0)
      fail("tp.sp: the rows of a micro-batch, batch_size %d (from global_batch) x seq_len %d, must be divisible by "
           "--tp %d (or set tp.sp=false)", o.batch_size, o.seq_len, l.tp);
  }
  // A GPU's figures are for the GPU code path (flash attention, large logits chunks) unless the
  // options name a device.
  if (!device_given) o.device = r.hw.device;
  o.parallel.dp = l.dp;
  config::check_size_limits(o);  // again with dp and the micro-batch resolved
  r.options = o;
  r.gpus = gpus > 0 ? gpus : l.world();
  return r;
}

int plan_main(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "-h" || a == "--help") {
      std::fputs("usage: minitrain plan [train options] [hw=NAME|FILE] [gpus=N] [tokens=N] [--json]\n"
                 "       minitrain plan --search gpus=N [model, batch and precision options] [hw=...] [top=K]\n"
                 "  every option of `minitrain train` (model, dp/tp/pp/cp, zero, precision, recompute, batch_size,\n"
                 "  global_batch, seq_len, grad_accum, pp.schedule, pp.virtual ...: see minitrain train --help)\n"
                 "  hw      string  h100 | h200 | a100 (SXM datasheets) | cpu | a hardware JSON file, e.g. one\n"
                 "                  written by `minitrain bench --calibrate out=FILE` (cpu)\n"
                 "  gpus    int     chips in all (dp = gpus / (tp x pp x cp) unless dp is given)\n"
                 "  tokens  number  a token budget: steps, wall-clock time and chip-hours\n"
                 "  top     int     --search: layouts shown in full (5)\n"
                 "  noise_scale  number  a gradient noise scale B_simple in tokens: is the global batch below or\n"
                 "                  above the critical batch, and what doubling it (2x the dp ranks) buys\n"
                 "  noise_from   path    the same, read from a run's metrics.jsonl (its last logged gns)\n"
                 "  --json          the report as one JSON object\n"
                 "  --search        rank the layouts (tp, pp, cp, dp, zero, recompute) that fit by predicted\n"
                 "                  throughput at the same global batch; one line for each loser, saying why\n"
                 "Prints per-rank memory by category, FLOPs per token and step, bytes per step on each group,\n"
                 "the pipeline schedule grid and bubble (pp > 1), predicted step time and MFU. A layout that\n"
                 "does not fit in memory also fails with one line saying which category and by how much.\n"
                 "Exit status: 0 a plan; 2 refused (a bad option, a value beyond the arithmetic's bounds, a layout\n"
                 "that does not fit, a search of more than 100000 layouts); 1 any other error.\n",
                 stdout);
      return 0;
    }
  // A plan refused (bad options, a layout that does not fit) exits 2, as `minitrain train` refusing the
  // same options does (runtime/exit_status.h).
  try {
    const PlanRequest r = parse_plan_request(args);
    std::string out;
    if (r.search) {
      SearchProgress progress;  // a search that takes more than a second says how far it is, each second
      progress.report = [](size_t tried, size_t total) {
        std::fprintf(stderr, "minitrain plan --search: %zu of %zu layouts tried\n", tried, total);
      };
      out = plan_search(r, progress);
    } else {
      out = r.json ? plan_json(r).dump(2) + "\n" : plan_report(args);
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    if (!r.search) {
      const std::string over = memory_over(plan_memory_worst(r.options, r.layout), r.hw);
      if (!over.empty()) {
        std::fflush(stdout);
        std::fprintf(stderr, "minitrain: error: %s does not fit: %s\n", parallel::layout_name(r.layout).c_str(), over.c_str());
        return kExitRefused;
      }
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "minitrain: error: %s\n", e.what());
    return kExitRefused;
  }
}

}  // namespace mt::plan
