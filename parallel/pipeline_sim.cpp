#include "parallel/pipeline_sim.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <limits>

#include "runtime/check.h"

namespace mt::parallel {

double Simulation::ideal() const { return busy.empty() ? 0 : *std::max_element(busy.begin(), busy.end()); }

double Simulation::bubble_fraction() const {
  if (makespan <= 0) return 0;
  double idle = 0;
  for (double b : busy) idle += makespan - b;
  return idle / (double(p) * makespan);
}

double Simulation::bubble_over_ideal() const { return ideal() > 0 ? bubble_time() / ideal() : 0; }

double formula_bubble_time(const ScheduleSpec& s, const PipelineCosts& c) {
  const double full = c.forward + c.backward_input + c.backward_weight;
  switch (s.kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b: return (s.p - 1) * full;
    case ScheduleKind::interleaved: return (s.p - 1) * full / s.v;
    case ScheduleKind::zb1:
      if (s.m < s.p || c.backward_weight > std::min(c.forward, c.backward_input))
        return std::numeric_limits<double>::quiet_NaN();
      return (s.p - 1) * (c.forward + c.backward_input - c.backward_weight);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

namespace {

[[noreturn]] __attribute__((format(printf, 4, 5))) void reject(int rank, int index, const Action* a, const char* fmt,
                                                                ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[512];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::string where = strfmt("rank %d", rank);
  if (index >= 0) where += strfmt(", action %d", index);
  if (a) where += ", " + describe(*a);
  fail("pipeline schedule: %s: %s", where.c_str(), buf);
}

// Where each action of every (stage, micro-batch) sits in its rank's list (-1: absent).
enum Slot { kF, kB, kW, kRecvAct, kSendAct, kRecvGrad, kSendGrad, kSlots };

Slot slot_of(ActionKind k) {
  switch (k) {
    case ActionKind::forward: return kF;
    case ActionKind::backward:
    case ActionKind::backward_input: return kB;
    case ActionKind::backward_weight: return kW;
    case ActionKind::recv_activation: return kRecvAct;
    case ActionKind::send_activation: return kSendAct;
    case ActionKind::recv_gradient: return kRecvGrad;
    case ActionKind::send_gradient: return kSendGrad;
  }
  return kF;
}

class Checker {
 public:
  explicit Checker(const Schedule& s) : s_(s), S_(s.stages()), m_(s.m()) {
    const ScheduleSpec& sp = s.spec;
    if (sp.p < 1 || sp.m < 1 || sp.v < 1 || int64_t(sp.p) * sp.m * sp.v > kMaxScheduleComputes)
      fail("pipeline schedule: p, m, v = %d, %d, %d: each must be at least 1 and p m v at most %lld", sp.p, sp.m, sp.v,
           (long long)kMaxScheduleComputes);
    if (int(s.ranks.size()) != sp.p) fail("pipeline schedule: %zu rank lists for p = %d", s.ranks.size(), sp.p);
    pos_.assign(size_t(S_) * m_ * kSlots, -1);
  }

  int& pos(int stage, int micro, Slot slot) { return pos_[(size_t(stage) * m_ + micro) * kSlots + slot]; }
  const Action& at(int stage, int micro, Slot slot) {
    return s_.ranks[size_t(s_.rank_of_stage(stage))][size_t(pos(stage, micro, slot))];
  }

  // Where the action of `slot` for (stage, micro) sits in its rank's list, -1 if absent.
  int position(int stage, int micro, Slot slot) const { return pos_[(size_t(stage) * m_ + micro) * kSlots + slot]; }

  void run() {
    for (int r = 0; r < s_.p(); r++) {
      const std::vector<Action>& list = s_.ranks[size_t(r)];
      for (int k = 0; k < int(list.size()); k++) record(r, k, list[size_t(k)]);
    }
    for (int st = 0; st < S_; st++)
      for (int i = 0; i < m_; i++) check_messages(st, i);
    for (int st = 0; st < S_; st++)
      for (int i = 0; i < m_; i++) check_present(st, i);
    for (int st = 0; st < S_; st++)
      for (int i = 0; i < m_; i++) check_ordered(st, i);
  }

 private:
  void record(int r, int k, const Action& a) {
    if (a.chunk < 0 || a.chunk >= s_.v()) reject(r, k, &a, "chunk outside 0..%d", s_.v() - 1);
    if (a.micro < 0 || a.micro >= m_) reject(r, k, &a, "micro-batch outside 0..%d", m_ - 1);
    const int st = s_.stage(r, a.chunk);
    if (is_compute(a.kind)) {
      if (a.peer != -1) reject(r, k, &a, "a compute action has no peer (got %d)", a.peer);
      const bool split_kind = a.kind == ActionKind::backward_input || a.kind == ActionKind::backward_weight;
      if (a.kind == ActionKind::backward && s_.split_backward())
        reject(r, k, &a, "%s splits the backward into B_input and W", schedule_kind_name(s_.spec.kind));
      if (split_kind && !s_.split_backward())
        reject(r, k, &a, "%s runs whole backwards (B); B_input and W are zb1's", schedule_kind_name(s_.spec.kind));
    } else {
      const bool to_prev = a.kind == ActionKind::recv_activation || a.kind == ActionKind::send_gradient;
      const int other = to_prev ? st - 1 : st + 1;
      if (other < 0 || other >= S_)
        reject(r, k, &a, "stage %d has no %s stage to talk to", st, to_prev ? "previous" : "next");
      if (s_.rank_of_stage(other) == r)
        reject(r, k, &a, "stage %d is on this rank too: hand it over in memory, not by a message", other);
      if (a.peer != s_.rank_of_stage(other))
        reject(r, k, &a, "stage %d is on rank %d, not rank %d", other, s_.rank_of_stage(other), a.peer);
    }
    int& p = pos(st, a.micro, slot_of(a.kind));
    if (p >= 0) reject(r, k, &a, "appears twice (first at action %d)", p);
    p = k;
  }

  // Every send has its receive on the peer and every receive its send.
  void check_messages(int st, int i) {
    const int r = s_.rank_of_stage(st);
    const struct {
      Slot send, recv;
      int to;
    } pairs[] = {{kSendAct, kRecvAct, st + 1}, {kSendGrad, kRecvGrad, st - 1}};
    for (const auto& pr : pairs) {
      if (pr.to < 0 || pr.to >= S_) continue;
      const int q = s_.rank_of_stage(pr.to);
      const bool has_send = pos(st, i, pr.send) >= 0, has_recv = pos(pr.to, i, pr.recv) >= 0;
      if (has_send && !has_recv)
        reject(r, pos(st, i, pr.send), &at(st, i, pr.send), "rank %d never receives it (no %s(chunk %d, micro %d) from rank %d)",
               q, pr.recv == kRecvAct ? "recv_activation" : "recv_gradient", s_.chunk_of_stage(pr.to), i, r);
      if (has_recv && !has_send)
        reject(q, pos(pr.to, i, pr.recv), &at(pr.to, i, pr.recv), "rank %d never sends it (no %s(chunk %d, micro %d) to rank %d)",
               r, pr.send == kSendAct ? "send_activation" : "send_gradient", s_.chunk_of_stage(st), i, q);
    }
  }

  // Each stage runs every compute action of every micro-batch (once: record() refuses a second).
  void check_present(int st, int i) {
    const bool split = s_.split_backward();
    auto need = [&](Slot slot, ActionKind kind) {
      if (pos(st, i, slot) < 0) {
        const Action a{kind, s_.chunk_of_stage(st), i, -1};
        reject(s_.rank_of_stage(st), -1, &a, "missing");
      }
    };
    need(kF, ActionKind::forward);
    need(kB, split ? ActionKind::backward_input : ActionKind::backward);
    if (split) need(kW, ActionKind::backward_weight);
  }

  // On its rank each action comes after what it needs there, and messages exist between ranks.
  void check_ordered(int st, int i) {
    const int r = s_.rank_of_stage(st);
    const bool split = s_.split_backward();
    // after(x, y): action x must come later in the list than y (both on rank r).
    auto after = [&](Slot x, int xst, Slot y, int yst, const char* why) {
      const int px = pos(xst, i, x), py = pos(yst, i, y);
      if (px >= 0 && py >= 0 && px < py)
        reject(r, px, &at(xst, i, x), "comes before %s at action %d, %s", describe(at(yst, i, y)).c_str(), py, why);
    };
    after(kB, st, kF, st, "the forward whose activations it uses");
    if (split) after(kW, st, kB, st, "which makes the output gradient W needs");
    after(kF, st, kRecvAct, st, "its input");
    after(kSendAct, st, kF, st, "which produces what it sends");
    after(kB, st, kRecvGrad, st, "its output gradient");
    after(kSendGrad, st, kB, st, "which produces what it sends");
    // Neighbouring stages on the same rank (p = 1): the hand-over is the list order itself.
    if (st > 0 && s_.rank_of_stage(st - 1) == r) after(kF, st, kF, st - 1, "whose output is its input");
    if (st + 1 < S_ && s_.rank_of_stage(st + 1) == r) after(kB, st, kB, st + 1, "whose input gradient it needs");
    // Communication must exist where neighbouring stages are on other ranks.
    if (st > 0 && s_.rank_of_stage(st - 1) != r && pos(st, i, kRecvAct) < 0)
      reject(r, pos(st, i, kF), &at(st, i, kF), "no recv_activation brings its input from rank %d", s_.rank_of_stage(st - 1));
    if (st + 1 < S_ && s_.rank_of_stage(st + 1) != r && pos(st, i, kSendAct) < 0)
      reject(r, pos(st, i, kF), &at(st, i, kF), "no send_activation takes its output to rank %d", s_.rank_of_stage(st + 1));
    if (st + 1 < S_ && s_.rank_of_stage(st + 1) != r && pos(st, i, kRecvGrad) < 0)
      reject(r, pos(st, i, kB), &at(st, i, kB), "no recv_gradient brings its output gradient from rank %d", s_.rank_of_stage(st + 1));
    if (st > 0 && s_.rank_of_stage(st - 1) != r && pos(st, i, kSendGrad) < 0)
      reject(r, pos(st, i, kB), &at(st, i, kB), "no send_gradient takes its input gradient to rank %d", s_.rank_of_stage(st - 1));
  }

  const Schedule& s_;
  int S_, m_;
  std::vector<int> pos_;
};

// The timeline itself obeys every dependency: a forward starts after the previous stage's forward
// of its micro-batch ended (plus the latency between ranks), a backward after its forward and the
// next stage's backward, W after its B_input. (The checks above make this so; this proves it.)
void check_dependency_times(const Schedule& s, const Checker& chk, const Simulation& sim, double latency) {
  const bool split = s.split_backward();
  for (int st = 0; st < s.stages(); st++) {
    const int r = s.rank_of_stage(st);
    for (int i = 0; i < s.m(); i++) {
      auto start = [&](Slot x) { return sim.times[size_t(r)][size_t(chk.position(st, i, x))].start; };
      auto need = [&](Slot x, int from_stage, Slot y) {
        const int q = s.rank_of_stage(from_stage);
        const int k = chk.position(from_stage, i, y);
        const double ready = sim.times[size_t(q)][size_t(k)].end + (q != r ? latency : 0);
        if (start(x) < ready - 1e-9 * (1 + ready)) {
          const int kx = chk.position(st, i, x);
          reject(r, kx, &s.ranks[size_t(r)][size_t(kx)], "starts at %g, before rank %d's %s ends at %g", start(x), q,
                 describe(s.ranks[size_t(q)][size_t(k)]).c_str(), ready);
        }
      };
      if (st > 0) need(kF, st - 1, kF);
      need(kB, st, kF);
      if (st + 1 < s.stages()) need(kB, st + 1, kB);
      if (split) need(kW, st, kB);
    }
  }
}

struct Message {
  int sender_index;  // in the sender's list
  double arrival;
};

}  // namespace

Simulation simulate(const Schedule& s, const PipelineCosts& costs) {
  Checker checker(s);
  checker.run();
  const int p = s.p(), v = s.v();
  Simulation sim;
  sim.p = p, sim.m = s.m(), sim.v = v;
  sim.times.resize(size_t(p));
  sim.busy.assign(size_t(p), 0);
  sim.peak_pairs.assign(size_t(p), 0);
  for (int r = 0; r < p; r++) sim.times[size_t(r)].resize(s.ranks[size_t(r)].size());

  std::vector<std::vector<Message>> channel(size_t(p) * p);  // [from * p + to]: messages sent so far
  std::vector<size_t> received(size_t(p) * p, 0);
  std::vector<size_t> pc(size_t(p), 0);
  std::vector<double> clock(size_t(p), 0);
  std::vector<int> held(size_t(p), 0);
  auto cost = [&](ActionKind k) {
    switch (k) {
      case ActionKind::forward: return costs.forward / v;
      case ActionKind::backward: return (costs.backward_input + costs.backward_weight) / v;
      case ActionKind::backward_input: return costs.backward_input / v;
      case ActionKind::backward_weight: return costs.backward_weight / v;
      default: return 0.0;
    }
  };
  // Runs rank r's next action if it can; false when it waits for a message.
  auto step = [&](int r) {
    const std::vector<Action>& list = s.ranks[size_t(r)];
    const int k = int(pc[size_t(r)]);
    const Action& a = list[size_t(k)];
    ActionTime& t = sim.times[size_t(r)][size_t(k)];
    double& now = clock[size_t(r)];
    t.start = now;
    if (a.kind == ActionKind::send_activation || a.kind == ActionKind::send_gradient) {
      channel[size_t(r) * p + a.peer].push_back({k, now + costs.p2p_latency});
    } else if (a.kind == ActionKind::recv_activation || a.kind == ActionKind::recv_gradient) {
      const size_t ch = size_t(a.peer) * p + r;
      if (received[ch] == channel[ch].size()) return false;
      const Message& msg = channel[ch][received[ch]];
      const Action& sent = s.ranks[size_t(a.peer)][size_t(msg.sender_index)];
      const bool act = a.kind == ActionKind::recv_activation;
      const int from_stage = s.stage(r, a.chunk) + (act ? -1 : 1);
      const ActionKind want = act ? ActionKind::send_activation : ActionKind::send_gradient;
      if (sent.kind != want || sent.micro != a.micro || s.stage(a.peer, sent.chunk) != from_stage)
        reject(r, k, &a, "would receive rank %d's %s (its action %d): messages from one rank to another match in list order",
               a.peer, describe(sent).c_str(), msg.sender_index);
      received[ch]++;
      now = std::max(now, msg.arrival);
    } else {
      now += cost(a.kind);
      sim.busy[size_t(r)] += cost(a.kind);
      if (a.kind == ActionKind::forward) {
        held[size_t(r)]++;
        sim.peak_pairs[size_t(r)] = std::max(sim.peak_pairs[size_t(r)], held[size_t(r)]);
      }
      if (a.kind == ActionKind::backward_weight || a.kind == ActionKind::backward) held[size_t(r)]--;
    }
    t.end = now;
    pc[size_t(r)]++;
    return true;
  };
  for (;;) {
    bool moved = false, done = true;
    for (int r = 0; r < p; r++) {
      while (pc[size_t(r)] < s.ranks[size_t(r)].size() && step(r)) moved = true;
      done = done && pc[size_t(r)] == s.ranks[size_t(r)].size();
    }
    if (done) break;
    if (!moved) {
      std::string waits;
      for (int r = 0; r < p; r++) {
        if (pc[size_t(r)] == s.ranks[size_t(r)].size()) continue;
        const Action& a = s.ranks[size_t(r)][pc[size_t(r)]];
        waits += strfmt("%srank %d waits at action %zu, %s", waits.empty() ? "" : "; ", r, pc[size_t(r)], describe(a).c_str());
      }
      fail("pipeline schedule: deadlock: %s", waits.c_str());
    }
  }
  for (int r = 0; r < p; r++) sim.makespan = std::max(sim.makespan, clock[size_t(r)]);
  check_dependency_times(s, checker, sim, costs.p2p_latency);
  return sim;
}

std::string render_grid(const Schedule& s, const Simulation& sim, double slot) {
  MT_CHECK(slot > 0, "slot %g", slot);
  auto to_slot = [&](double t) {
    const double x = t / slot;
    const double n = std::round(x);
    MT_CHECK(std::abs(x - n) < 1e-6, "time %g is not a multiple of the slot %g", t, slot);
    return size_t(n);
  };
  const size_t rows = to_slot(sim.makespan);
  std::vector<std::vector<std::string>> cell(rows, std::vector<std::string>(size_t(s.p()), "."));
  size_t width = 1;
  for (int r = 0; r < s.p(); r++) {
    for (size_t k = 0; k < s.ranks[size_t(r)].size(); k++) {
      const Action& a = s.ranks[size_t(r)][k];
      if (!is_compute(a.kind)) continue;
      const char* letter = a.kind == ActionKind::forward ? "F" : a.kind == ActionKind::backward_weight ? "W" : "B";
      const std::string label = (s.v() > 1 ? std::to_string(a.chunk) : "") + letter + std::to_string(a.micro);
      width = std::max(width, label.size());
      for (size_t t = to_slot(sim.times[size_t(r)][k].start); t < to_slot(sim.times[size_t(r)][k].end); t++)
        cell[t][size_t(r)] = label;
    }
  }
  const int tw = std::max(4, int(std::to_string(rows).size()));
  const int cw = int(std::max<size_t>(width, 1 + std::to_string(s.p() - 1).size()));
  std::string out = strfmt("%*s", tw, "t");
  for (int r = 0; r < s.p(); r++) out += strfmt(" %-*s", cw, ("r" + std::to_string(r)).c_str());
  while (out.back() == ' ') out.pop_back();
  out += "\n";
  for (size_t t = 0; t < rows; t++) {
    out += strfmt("%*zu", tw, t);
    for (int r = 0; r < s.p(); r++) out += strfmt(" %-*s", cw, cell[t][size_t(r)].c_str());
    while (out.back() == ' ') out.pop_back();
    out += "\n";
  }
  return out;
}

}  // namespace mt::parallel
