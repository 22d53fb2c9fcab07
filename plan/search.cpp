// `minitrain plan --search`: every layout of gpus=N chips (tp, cp, pp, dp, ZeRO stage, recompute mode)
// at the request's global batch, checked by the trainer's own rules, sized by the memory model and
// ranked by the predicted throughput; the losers each get one line saying why.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>

#include "plan/plan.h"
#include "runtime/check.h"

namespace mt::plan {
namespace {

struct Candidate {
  config::TrainOptions o;
  parallel::MeshLayout l;
  PlanResult r;
  std::string invalid;  // the trainer's rule it breaks
  std::string name() const {
    // A layout whose dp does not divide the global batch has no micro-batch count: none is shown.
    return strfmt("TP(%d)-CP(%d)-PP(%d)-DP(%d) zero=%d recompute=%s B=%d", l.tp, l.cp, l.pp, l.dp, o.parallel.zero,
                  model::recompute_name(o.recompute), o.batch_size) +
           (o.grad_accum > 0 ? strfmt(" accum=%d", o.grad_accum) : std::string());
  }
};

// The divisors of n in increasing order, in O(sqrt n).
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t k = 1; k * k <= n; k++)
    if (n % k == 0) {
      low.push_back(k);
      if (k != n / k) high.push_back(n / k);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// One mesh of the search and the micro-batch sizes tried on it.
struct Mesh {
  int tp, cp, pp, dp;
  std::vector<int> micro;
};
constexpr int kZeroStages = 4, kRecomputeModes = 3;

// Every mesh of `gpus` chips and their layouts' count; refused beyond kMaxSearchLayouts (counted
// before the micro-batch sizes are, which take a divisor search each). The micro-batch: the largest
// the request allows (fewest, biggest GEMMs), and one row (the most micro-batches: a pipeline's
// bubble shrinks, activations too).
std::vector<Mesh> meshes(const PlanRequest& req, int64_t G, size_t& total) {
  const config::TrainOptions& base = req.options;
  const int gpus = req.gpus;
  std::vector<Mesh> out;
  for (int64_t tp : divisors(gpus))
    for (int64_t cp : divisors(gpus / tp))
      for (int64_t pp : divisors(gpus / tp / cp)) out.push_back({int(tp), int(cp), int(pp), int(gpus / tp / cp / pp), {}});
  const auto refuse = [&](size_t layouts, const char* about) {
    fail("plan --search gpus=%d: %s%zu layouts (%zu meshes x 1 or 2 micro-batch sizes x %d ZeRO stages x %d recompute "
         "modes), more than the search's bound of %zu: search fewer gpus", gpus, about, layouts, out.size(),
         kZeroStages, kRecomputeModes, kMaxSearchLayouts);
  };
  if (out.size() * kZeroStages * kRecomputeModes > kMaxSearchLayouts)
    refuse(out.size() * kZeroStages * kRecomputeModes, "at least ");
  total = 0;
  for (Mesh& m : out) {
    int64_t B_max = 1;
    if (G % m.dp == 0) {  // else the layout breaks a rule, whatever its micro-batch
      const int64_t most = req.global_rows > 0 ? std::max<int64_t>(1, G / m.dp / base.grad_accum) : base.batch_size;
      for (int64_t d : divisors(G / m.dp))  // the largest B with B x dp dividing the global batch
        if (d <= most) B_max = d;
    }
    m.micro = B_max > 1 ? std::vector<int>{int(B_max), 1} : std::vector<int>{1};
    total += m.micro.size() * kZeroStages * kRecomputeModes;
  }
  if (total > kMaxSearchLayouts) refuse(total, "");
  return out;
}

// The parts of a step, to say where a slower layout loses its time against the best.
std::vector<std::pair<const char*, double>> parts(const TimePlan& t) {
  const double work = t.gemm_s + t.attention_s + t.memory_s + t.tp_s + t.cp_s + t.ep_s;
  return {{"GEMMs (recompute included)", t.gemm_s}, {"attention", t.attention_s}, {"memory-bound ops", t.memory_s},
          {"optimizer", t.optimizer_s}, {"gradient passes", t.grad_passes_s},
          {"ep communication", t.ep_s},            {"tp communication", t.tp_s},            {"cp communication", t.cp_s},     {"pp communication", t.pp_s},
          {"exposed dp communication", t.dp_exposed_s}, {"pipeline bubble", work * t.bubble}};
}

std::string why_slower(const TimePlan& t, const TimePlan& best) {
  const auto a = parts(t), b = parts(best);
  size_t worst = 0;
  for (size_t i = 1; i < a.size(); i++)
    if (a[i].second - b[i].second > a[worst].second - b[worst].second) worst = i;
  return strfmt("slower: %.4g tokens/s (%.0f%% of the best), mostly %s (%.3f ms against %.3f ms)", t.tokens_per_s(),
                100.0 * t.tokens_per_s() / best.tokens_per_s(), a[worst].first, 1e3 * a[worst].second,
                1e3 * b[worst].second);
}

}  // namespace

std::string plan_search(const PlanRequest& req, const SearchProgress& progress) {
  const config::TrainOptions& base = req.options;
  const int gpus = req.gpus;
  // The global batch in rows stays the request's: B x accum x dp.
  const int64_t G = req.global_rows > 0 ? req.global_rows : int64_t(base.batch_size) * base.grad_accum * req.layout.dp;
  size_t total = 0;
  const std::vector<Mesh> grid = meshes(req, G, total);
  using Clock = std::chrono::steady_clock;
  const auto every = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(progress.every_s));
  auto next_report = Clock::now() + every;
  std::vector<Candidate> all;
  all.reserve(total);
  for (const Mesh& mesh : grid) {
    const int tp = mesh.tp, cp = mesh.cp, pp = mesh.pp, dp = mesh.dp;
    for (int B : mesh.micro)
      for (int zero = 0; zero < kZeroStages; zero++)
        for (model::Recompute rc : {model::Recompute::none, model::Recompute::selective, model::Recompute::full}) {
          Candidate c;
          c.o = base;
          c.l = {.dp = dp, .pp = pp, .cp = cp, .tp = tp, .ep = base.parallel.ep};  // the request's ep, kept (validate: it divides dp x cp)
          c.o.parallel.dp = dp;
          c.o.parallel.tp = tp;
          c.o.parallel.pp = pp;
          c.o.parallel.cp = cp;
          c.o.parallel.sp = -1;
          c.o.parallel.zero = zero;
          c.o.recompute = rc;
          c.o.global_batch = 0;
          c.o.batch_size = B;
          // More micro-batches than an int holds is refused by validate() (grad_accum's limit) below.
          c.o.grad_accum = int(std::min<int64_t>(G / std::max<int64_t>(1, int64_t(B) * dp), INT32_MAX));
          try {
            if (G % dp != 0) fail("the global batch of %lld rows is not divisible by dp %d", (long long)G, dp);
            // The trainer's rules, with the CPU-only limits of today's code left out (cp runs on CPUs
            // only so far): what the design allows.
            config::TrainOptions v = c.o;
            v.device = Device::cpu;
            v.validate();
            c.r = evaluate_plan(c.o, c.l, req.hw);
          } catch (const Error& e) {
            c.invalid = e.what();
          }
          all.push_back(std::move(c));
          if (progress.report && Clock::now() >= next_report) {
            progress.report(all.size(), total);
            next_report = Clock::now() + every;
          }
        }
  }
  std::vector<const Candidate*> fit, over, invalid;
  for (const Candidate& c : all)
    (c.invalid.empty() ? (c.r.over.empty() ? fit : over) : invalid).push_back(&c);
  std::stable_sort(fit.begin(), fit.end(), [](const Candidate* a, const Candidate* b) {
    return a->r.time.tokens_per_s() > b->r.time.tokens_per_s();
  });
  std::string s = strfmt("search: %s (%s parameters) on %d x %s, %lld rows x %d tokens per step, precision=%s: %zu "
                         "layouts, %zu fit, %zu do not fit, %zu break a rule\n",
                         base.model_preset.c_str(), strfmt("%.3g", double(base.model.num_params())).c_str(), gpus,
                         req.hw.name.c_str(), (long long)G, base.seq_len,
                         base.to_json()["precision"].get<std::string>().c_str(), all.size(), fit.size(), over.size(),
                         invalid.size());
  if (fit.empty()) {
    s += "no layout fits";
    if (!over.empty()) {
      const Candidate* least = *std::min_element(over.begin(), over.end(), [](const Candidate* a, const Candidate* b) {
        return a->r.memory.total() < b->r.memory.total();
      });
      s += strfmt(": the smallest, %s, %s", least->name().c_str(), least->r.over.c_str());
    }
    return s + "\n";
  }
  s += strfmt("best %zu by predicted tokens/s:\n", std::min<size_t>(size_t(req.top), fit.size()));
  for (size_t i = 0; i < fit.size() && i < size_t(req.top); i++) {
    const Candidate& c = *fit[i];
    const TimePlan& t = c.r.time;
    s += strfmt("  %zu. %s: %.4g tokens/s, MFU %.1f%%, step %.3f ms, %s per rank (bubble %.3f, comm tp %.3f cp %.3f "
                "pp %.3f dp %.3f ms)\n",
                i + 1, c.name().c_str(), t.tokens_per_s(), 100 * t.mfu, 1e3 * t.step_s,
                format_bytes(c.r.memory.total()).c_str(), t.bubble, 1e3 * t.tp_s, 1e3 * t.cp_s, 1e3 * t.pp_s,
                1e3 * t.dp_exposed_s);
  }
  s += "the others:\n";
  const TimePlan& best = fit[0]->r.time;
  for (size_t i = size_t(req.top); i < fit.size(); i++)
    s += strfmt("  %s: %s\n", fit[i]->name().c_str(), why_slower(fit[i]->r.time, best).c_str());
  for (const Candidate* c : over) s += strfmt("  %s: does not fit: %s\n", c->name().c_str(), c->r.over.c_str());
  for (const Candidate* c : invalid) s += strfmt("  %s: not a valid layout: %s\n", c->name().c_str(), c->invalid.c_str());
  return s;
}

}  // namespace mt::plan
