#include "parallel/pipeline_schedule.h"

#include <algorithm>

#include "runtime/check.h"

namespace mt::parallel {

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::gpipe;
  if (name == "1f1b") return ScheduleKind::one_f_one_b;
  if (name == "interleaved") return ScheduleKind::interleaved;
  if (name == "zb1") return ScheduleKind::zb1;
  fail("pp.schedule: unknown schedule '%s' (expected gpipe, 1f1b, interleaved or zb1)", name.c_str());
}

const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
    case ScheduleKind::zb1: return "zb1";
  }
  return "?";
}

const char* action_kind_name(ActionKind k) {
  switch (k) {
    case ActionKind::forward: return "F";
    case ActionKind::backward: return "B";
    case ActionKind::backward_input: return "B_input";
    case ActionKind::backward_weight: return "W";
    case ActionKind::recv_activation: return "recv_activation";
    case ActionKind::send_activation: return "send_activation";
    case ActionKind::recv_gradient: return "recv_gradient";
    case ActionKind::send_gradient: return "send_gradient";
  }
  return "?";
}

bool is_compute(ActionKind k) {
  return k == ActionKind::forward || k == ActionKind::backward || k == ActionKind::backward_input ||
         k == ActionKind::backward_weight;
}

std::string describe(const Action& a) {
  std::string s = strfmt("%s(chunk %d, micro %d)", action_kind_name(a.kind), a.chunk, a.micro);
  if (a.kind == ActionKind::send_activation || a.kind == ActionKind::send_gradient) s += strfmt(" to rank %d", a.peer);
  if (a.kind == ActionKind::recv_activation || a.kind == ActionKind::recv_gradient) s += strfmt(" from rank %d", a.peer);
  return s;
}

void check_schedule_spec(const ScheduleSpec& s) {
  const char* name = schedule_kind_name(s.kind);
  if (s.p < 1) fail("pp must be at least 1 (got %d)", s.p);
  if (s.m < 1) fail("grad_accum (micro-batches per step) must be at least 1 (got %d)", s.m);
  if (s.v < 1) fail("pp.virtual (model chunks per rank) must be at least 1 (got %d)", s.v);
  if (s.kind == ScheduleKind::interleaved) {
    if (s.v < 2)
      fail("pp.schedule=interleaved needs pp.virtual >= 2 model chunks per rank (got %d; one chunk is 1f1b)", s.v);
    if (s.m % s.p != 0)
      fail("pp.schedule=interleaved needs grad_accum (%d micro-batches) to be a multiple of pp (%d): it runs "
           "micro-batches in rounds of pp per model chunk", s.m, s.p);
  } else if (s.v != 1) {
    fail("pp.virtual=%d needs pp.schedule=interleaved (%s runs one model chunk per rank)", s.v, name);
  }
  if (int64_t(s.p) * s.m * s.v > kMaxScheduleComputes)
    fail("pp x grad_accum x pp.virtual = %lld forward passes per step is more than a schedule holds (at most %lld)",
         (long long)(int64_t(s.p) * s.m * s.v), (long long)kMaxScheduleComputes);
}

namespace {

Action compute(ActionKind k, int chunk, int micro) { return Action{k, chunk, micro, -1}; }

// 1f1b and zb1 share warmup / steady / cooldown; zb1 splits the backward and defers W.
std::vector<Action> one_f_one_b_rank(int p, int m, int r, bool zb) {
  const ActionKind bwd = zb ? ActionKind::backward_input : ActionKind::backward;
  const int warmup = std::min(p - r - 1, m);
  // zb1: W of micro-batch j runs after B of micro-batch j + r in the steady phase (rank r has r
  // more micro-batches in flight than in 1f1b, p at most), then one W after each cooldown B, then
  // the rest: the Ws fill the gaps where 1f1b's cooldown waits for gradients.
  int next_w = 0;
  std::vector<Action> out;
  for (int i = 0; i < warmup; i++) out.push_back(compute(ActionKind::forward, 0, i));
  for (int k = 0; k < m - warmup; k++) {  // steady: one forward, one backward
    out.push_back(compute(ActionKind::forward, 0, warmup + k));
    out.push_back(compute(bwd, 0, k));
    if (zb && k >= r) out.push_back(compute(ActionKind::backward_weight, 0, next_w++));
  }
  for (int k = m - warmup; k < m; k++) {  // cooldown
    out.push_back(compute(bwd, 0, k));
    if (zb) out.push_back(compute(ActionKind::backward_weight, 0, next_w++));
  }
  while (zb && next_w < m) out.push_back(compute(ActionKind::backward_weight, 0, next_w++));
  return out;
}

std::vector<Action> gpipe_rank(int m) {
  std::vector<Action> out;
  for (int i = 0; i < m; i++) out.push_back(compute(ActionKind::forward, 0, i));
  for (int i = 0; i < m; i++) out.push_back(compute(ActionKind::backward, 0, i));
  return out;
}

// Megatron's interleaved order: the k-th forward of a rank is chunk (k / p) % v of micro-batch
// (k / (p v)) p + k % p; the k-th backward the same with the chunk reversed (needs m % p == 0).
std::vector<Action> interleaved_rank(int p, int m, int v, int r) {
  const int n = m * v;
  auto fwd = [&](int k) { return compute(ActionKind::forward, (k / p) % v, (k / (p * v)) * p + k % p); };
  auto bwd = [&](int k) { return compute(ActionKind::backward, v - 1 - (k / p) % v, (k / (p * v)) * p + k % p); };
  const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, n);
  std::vector<Action> out;
  for (int k = 0; k < warmup; k++) out.push_back(fwd(k));
  for (int k = 0; k < n - warmup; k++) {
    out.push_back(fwd(warmup + k));
    out.push_back(bwd(k));
  }
  for (int k = n - warmup; k < n; k++) out.push_back(bwd(k));
  return out;
}

}  // namespace

std::vector<std::vector<Action>> compute_order(const ScheduleSpec& spec) {
  check_schedule_spec(spec);
  std::vector<std::vector<Action>> ranks(size_t(spec.p));
  for (int r = 0; r < spec.p; r++) {
    switch (spec.kind) {
      case ScheduleKind::gpipe: ranks[size_t(r)] = gpipe_rank(spec.m); break;
      case ScheduleKind::one_f_one_b: ranks[size_t(r)] = one_f_one_b_rank(spec.p, spec.m, r, false); break;
      case ScheduleKind::zb1: ranks[size_t(r)] = one_f_one_b_rank(spec.p, spec.m, r, true); break;
      case ScheduleKind::interleaved: ranks[size_t(r)] = interleaved_rank(spec.p, spec.m, spec.v, r); break;
    }
  }
  return ranks;
}

Schedule lower_communication(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& compute_lists) {
  MT_CHECK(int(compute_lists.size()) == spec.p, "%zu rank lists for pp = %d", compute_lists.size(), spec.p);
  Schedule s;
  s.spec = spec;
  s.ranks.resize(compute_lists.size());
  const int last = s.stages() - 1;
  for (int r = 0; r < spec.p; r++) {
    std::vector<Action>& out = s.ranks[size_t(r)];
    for (const Action& a : compute_lists[size_t(r)]) {
      MT_CHECK(is_compute(a.kind), "rank %d: %s is not a compute action", r, describe(a).c_str());
      const int st = s.stage(r, a.chunk);
      // With p = 1 neighbouring stages share the rank: nothing to send.
      const bool prev_remote = st > 0 && spec.p > 1;
      const bool next_remote = st < last && spec.p > 1;
      const int prev = st > 0 ? s.rank_of_stage(st - 1) : -1, next = s.rank_of_stage(st + 1);
      const bool bwd = a.kind == ActionKind::backward || a.kind == ActionKind::backward_input;
      if (a.kind == ActionKind::forward && prev_remote) out.push_back({ActionKind::recv_activation, a.chunk, a.micro, prev});
      if (bwd && next_remote) out.push_back({ActionKind::recv_gradient, a.chunk, a.micro, next});
      out.push_back(a);
      if (a.kind == ActionKind::forward && next_remote) out.push_back({ActionKind::send_activation, a.chunk, a.micro, next});
      if (bwd && prev_remote) out.push_back({ActionKind::send_gradient, a.chunk, a.micro, prev});
    }
  }
  return s;
}

Schedule build_schedule(const ScheduleSpec& spec) { return lower_communication(spec, compute_order(spec)); }

}  // namespace mt::parallel
