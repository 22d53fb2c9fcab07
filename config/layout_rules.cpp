// The pipeline's layout rules (train/pipeline.h runs them): which layers each stage holds, the
// schedule the options name, how the executor pairs messages, and the checks that refuse a pipeline
// the model or the backend cannot run. Called by the options, the planner and the trainer.
#include "config/layout_rules.h"

#include <algorithm>
#include <sstream>

#include "parallel/pipeline_exchange.h"
#include "runtime/check.h"

namespace mt::config {

parallel::ScheduleSpec pipeline_spec(const TrainOptions& o) {
  parallel::ScheduleSpec s;
  s.kind = parallel::parse_schedule_kind(o.parallel.pp_schedule);
  s.p = o.parallel.pp;
  s.m = o.grad_accum;
  s.v = o.parallel.pp_virtual;
  return s;
}

namespace {

// "3,3,2,4" -> {3, 3, 2, 4}; fails naming pp.layers.
std::vector<int> parse_layers(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long n = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || n < 1 || n > 1 << 20)
      fail("pp.layers=%s: '%s' is not a positive layer count (expected e.g. pp.layers=3,3,2,4, one per stage)",
           text.c_str(), item.c_str());
    out.push_back(int(n));
  }
  if (!text.empty() && text.back() == ',') fail("pp.layers=%s ends in a comma", text.c_str());
  return out;
}

}  // namespace

std::vector<int> balanced_layers(int L, int S, int64_t layer, int64_t first_extra, int64_t last_extra) {
  MT_CHECK(S >= 1 && L >= S, "balanced_layers: %d layers over %d stages", L, S);
  struct Best {
    int64_t max = INT64_MAX;
    __int128 sq = 0;
    int len = 0;  // layers of the last of these stages
  };
  // best[s][j]: the first j layers over the first s stages.
  std::vector<std::vector<Best>> best(size_t(S) + 1, std::vector<Best>(size_t(L) + 1));
  best[0][0] = {0, 0, 0};
  for (int s = 1; s <= S; s++) {
    for (int j = s; j <= L - (S - s); j++) {
      Best& b = best[size_t(s)][size_t(j)];
      for (int k = s - 1; k < j; k++) {  // the longest last stage first: it wins ties
        const Best& a = best[size_t(s - 1)][size_t(k)];
        if (a.max == INT64_MAX) continue;
        const int64_t c = (j - k) * layer + (s == 1 ? first_extra : 0) + (s == S ? last_extra : 0);
        const Best cand{std::max(a.max, c), a.sq + __int128(c) * c, j - k};
        if (cand.max < b.max || (cand.max == b.max && cand.sq < b.sq)) b = cand;
      }
    }
  }
  std::vector<int> out(static_cast<size_t>(S));
  for (int s = S, j = L; s >= 1; s--) {
    out[size_t(s - 1)] = best[size_t(s)][size_t(j)].len;
    j -= out[size_t(s - 1)];
  }
  return out;
}

std::vector<int> stage_layers(const TrainOptions& o) {
  const int S = o.parallel.pp * o.parallel.pp_virtual, L = o.model.n_layer;
  if (!o.parallel.pp_layers.empty()) {
    const std::vector<int> given = parse_layers(o.parallel.pp_layers);
    int sum = 0;
    for (int n : given) sum += n;
    if (int(given.size()) != S)
      fail("pp.layers=%s lists %zu stages but --pp %d x pp.virtual %d makes %d", o.parallel.pp_layers.c_str(),
           given.size(), o.parallel.pp, o.parallel.pp_virtual, S);
    if (sum != L)
      fail("pp.layers=%s sums to %d layers but the model has %d (model.n_layer)", o.parallel.pp_layers.c_str(), sum,
           L);
    return given;
  }
  // Interleaved runs its chunks in rounds: equal chunks (n_layer divisible by pp x pp.virtual).
  if (parallel::parse_schedule_kind(o.parallel.pp_schedule) == parallel::ScheduleKind::interleaved)
    return std::vector<int>(size_t(S), L / S);
  // Balanced by model FLOPs per token, forward and backward: a layer 6 (12 C^2) + 12 C T (its
  // weight GEMMs and attention), the classifier 6 C Vp (on the last stage), the embedding 3 C (the
  // rows' sum, and its backward into wte and wpe, on stage 0).
  const int64_t C = o.model.n_embd, T = o.seq_len;
  return balanced_layers(L, S, 72 * C * C + 12 * C * T, 3 * C, 6 * C * o.model.padded_vocab());
}

model::StagePlan stage_plan(const TrainOptions& o, int pp_rank) {
  const int p = o.parallel.pp, v = o.parallel.pp_virtual;
  const std::vector<int> layers = stage_layers(o);
  std::vector<int> start(layers.size() + 1, 0);
  for (size_t s = 0; s < layers.size(); s++) start[s + 1] = start[s] + layers[s];
  model::StagePlan plan;
  for (int c = 0; c < v; c++) {
    const size_t s = size_t(c * p + pp_rank);
    plan.chunks.push_back({start[s], start[s + 1]});
  }
  plan.first = pp_rank == 0;
  plan.last = pp_rank == p - 1;
  return plan;
}

void check_pipeline_options(const TrainOptions& o) {
  const int p = o.parallel.pp, v = o.parallel.pp_virtual, L = o.model.n_layer;
  const parallel::ScheduleKind kind = parallel::parse_schedule_kind(o.parallel.pp_schedule);
  if (p == 1) {
    if (v != 1) fail("pp.virtual=%d needs --pp 2 or more (the chunks of a rank interleave with other ranks')", v);
    if (!o.parallel.pp_layers.empty()) fail("pp.layers=%s needs --pp 2 or more", o.parallel.pp_layers.c_str());
    return;
  }
  parallel::check_schedule_spec(pipeline_spec(o));
  if (int64_t(p) * v > L) {
    if (v == 1)
      fail("--pp %d is larger than the model's %d layers (model.n_layer): every stage needs at least one layer", p, L);
    fail("--pp %d x pp.virtual %d = %d stages, more than the model's %d layers (model.n_layer): every stage needs "
         "at least one layer", p, v, p * v, L);
  }
  if (!o.parallel.pp_layers.empty())
    stage_layers(o);  // fails naming pp.layers
  else if (kind == parallel::ScheduleKind::interleaved && L % (p * v) != 0)
    fail("pp.schedule=interleaved: model.n_layer %d is not divisible by --pp %d x pp.virtual %d (or give each "
         "stage's layers with pp.layers)", L, p, v);
  if (o.device == Device::cuda && o.parallel.pp_exchange == "ahead")
    fail("pp.exchange=ahead with --device cuda: NCCL's sends wait for their receives, so receives posted ahead "
         "would hold up the sends queued behind them; use pp.exchange=auto or paired");
  if (pipeline_pairing(o) == parallel::Pairing::paired) {
    // Every schedule these options build runs as paired exchanges under NCCL's rendezvous sends
    // (parallel/pipeline_exchange.h, proven on the whole grid); checked here so that a schedule that
    // did not would fail before any work, in one line, rather than hang.
    try {
      parallel::check_exchanges(parallel::build_schedule(pipeline_spec(o)));
    } catch (const Error& e) {
      fail("pp.schedule=%s with %s (--pp %d, grad_accum %d, pp.virtual %d): internal error: its paired exchanges "
           "would deadlock (%s)",
           o.parallel.pp_schedule.c_str(), o.device == Device::cuda ? "--device cuda" : "pp.exchange=paired", p,
           o.grad_accum, v, e.what());
    }
  }
}

parallel::Pairing pipeline_pairing(const TrainOptions& o) {
  const std::string& x = o.parallel.pp_exchange;
  if (x == "paired" || (x == "auto" && o.device == Device::cuda)) return parallel::Pairing::paired;
  return parallel::Pairing::ahead;
}

}  // namespace mt::config
