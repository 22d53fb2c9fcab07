#include "plan/memory.h"

#include <algorithm>
#include <deque>

#include "config/layout_rules.h"
#include "model/gpt.h"
#include "moe/dispatch.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_sim.h"
#include "runtime/check.h"

namespace mt::plan {
namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// One unit's flat length: entries 16-element aligned, the unit a multiple of 16 x D (param_store.cpp).
int64_t padded_unit(const std::vector<int64_t>& entries, int D) {
  int64_t n = 0;
  for (int64_t e : entries) n += round_up(e, 16);
  const int64_t align = 16 * int64_t(D);
  return n == 0 ? align : round_up(n, align);
}

// The units of a stage, as model/gpt.cpp registers them: the model's store, and under expert
// parallelism (ep > 1, a mixture model) the store of the routed experts held apart, one unit per
// mixture layer, padded for and sharded over the expert-data group (D / ep ranks).
struct StageUnits {
  std::vector<int64_t> size;   // padded elements
  std::vector<int64_t> xsize;  // the expert store's units
  int emb = -1, pos = -1, fin = -1;
  std::vector<int> layers;     // unit of each of the stage's layers, in order
  std::vector<int> xlayers;    // each layer's expert-store unit (-1: none)
  int moe_layers = 0;          // the stage's mixture layers
  bool first = true, last = true;
};

bool experts_apart(const config::TrainOptions& o, const parallel::MeshLayout& l) { return l.ep > 1 && o.model.moe.enabled(); }

StageUnits stage_units(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank) {
  const model::GPTConfig& m = o.model;
  const model::StagePlan plan = l.pp > 1 ? config::stage_plan(o, pp_rank) : model::StagePlan::whole(m.n_layer);
  const int64_t C = m.n_embd, Vp = m.padded_vocab(), P = l.tp;
  const int D = l.dp * l.cp;
  StageUnits s;
  s.first = plan.first;
  s.last = plan.last;
  const bool tied_pair = plan.first != plan.last;
  if (plan.first || plan.last) {
    s.emb = int(s.size.size());
    std::vector<int64_t> e = {Vp / P * C};
    if (plan.first && !tied_pair) e.push_back(int64_t(m.block_size) * C);
    s.size.push_back(padded_unit(e, D));
  }
  if (plan.first && tied_pair) {
    s.pos = int(s.size.size());
    s.size.push_back(padded_unit({int64_t(m.block_size) * C}, D));
  } else {
    s.pos = s.emb;
  }
  for (const model::StagePlan::Chunk& k : plan.chunks)
    for (int layer = k.begin; layer < k.end; layer++) {
      std::vector<int64_t> e = {C, C, 3 * C / P * C, 3 * C / P, C * C / P, C, C, C};
      const std::vector<int64_t> mlp = {4 * C * C, 4 * C, 4 * C * C, C};
      int xunit = -1;
      if (m.is_moe_layer(layer)) {
        s.moe_layers++;
        e.push_back(int64_t(m.moe.experts) * C);
        const bool apart = experts_apart(o, l);
        for (int x = 0; x < m.moe.shared + (apart ? 0 : m.moe.experts); x++) e.insert(e.end(), mlp.begin(), mlp.end());
        if (apart) {
          std::vector<int64_t> x;
          for (int k = 0; k < m.moe.experts / l.ep; k++) x.insert(x.end(), mlp.begin(), mlp.end());
          xunit = int(s.xsize.size());
          s.xsize.push_back(padded_unit(x, D / l.ep));
        }
      } else {
        e.insert(e.end(), {4 * C / P * C, 4 * C / P, C * 4 * C / P, C});
      }
      s.layers.push_back(int(s.size.size()));
      s.xlayers.push_back(xunit);
      s.size.push_back(padded_unit(e, D));
    }
  if (plan.last) {
    s.fin = int(s.size.size());
    s.size.push_back(padded_unit({C, C}, D));
  }
  return s;
}

// What the data-parallel engine does with the units during one micro-batch (parallel/data_parallel.cpp):
// acquire (with or without a gradient buffer), release, gradient ready; replayed to find the peak of
// the per-unit buffers of ZeRO 2-3.
// engine 0: the model's store (data parallelism over dp x cp); 1: the experts held apart (over the
// expert-data group). A layer's expert unit is acquired after the layer's, released before it and
// reported ready after it (model/gpt.h acquire_layer).
struct UnitEvent {
  enum Kind { acquire, release, ready } kind;
  int unit;
  bool grads = false;
  int engine = 0;
};

std::vector<UnitEvent> micro_events(const StageUnits& s, bool emb_rows) {
  std::vector<UnitEvent> ev;
  auto A = [&](int u, bool g) { ev.push_back({UnitEvent::acquire, u, g}); };
  auto R = [&](int u) { ev.push_back({UnitEvent::release, u}); };
  auto G = [&](int u) { ev.push_back({UnitEvent::ready, u}); };
  auto layer = [&](size_t i, bool g, bool ready) {
    const int u = s.layers[i], x = s.xlayers[i];
    A(u, g);
    if (x >= 0) ev.push_back({UnitEvent::acquire, x, g, 1}), ev.push_back({UnitEvent::release, x, false, 1});
    R(u);
    if (!ready) return;
    G(u);
    if (x >= 0) ev.push_back({UnitEvent::ready, x, false, 1});
  };
  if (s.first) {
    A(s.emb, false);
    if (s.pos != s.emb) A(s.pos, false), R(s.pos);
    R(s.emb);
  }
  for (size_t i = 0; i < s.layers.size(); i++) layer(i, false, false);
  if (s.last) {
    A(s.fin, false), R(s.fin);
    A(s.emb, true), R(s.emb);
    if (emb_rows || !s.first) G(s.emb);
    A(s.fin, true), R(s.fin), G(s.fin);
  }
  for (size_t i = s.layers.size(); i-- > 0;) layer(i, true, true);
  if (s.first && !emb_rows) {
    A(s.emb, true);
    if (s.pos != s.emb) A(s.pos, true), R(s.pos), G(s.pos);
    R(s.emb), G(s.emb);
  }
  return ev;
}

constexpr size_t kMaxReductionsInFlight = 2;  // parallel/data_parallel.cpp
constexpr uint64_t kStepScalarsBytes = 24;    // Trainer::StepScalars: two doubles and a float
constexpr double kMaxReplayedUnits = double(1 << 22);  // micro-batches x units a ZeRO 2-3 replay walks

// Replays the unit events of `micros` micro-batches; returns the peaks of the transient gathered
// parameters (ZeRO-3), unit gradient buffers and reduce-scatter chunks (ZeRO 2-3).
struct Transients {
  uint64_t params = 0, grads = 0, comm = 0;
  std::vector<int> gathers;   // ZeRO-3: all-gathers of each unit (the model's store)
  std::vector<int> xgathers;  // the same for the expert store's units
};

// When the reductions complete: by the next poll (instant), while the next unit's backward runs (the
// plan's figure), or only when the bound of two in flight forces a wait (bound).
enum class Progress { instant, next_unit, bound };

Transients replay(const StageUnits& s, int zero, int D, int ep, size_t cb, bool emb_rows, int micros,
                  Progress progress = Progress::next_unit) {
  Transients peak;
  peak.gathers.assign(s.size.size(), 0);
  peak.xgathers.assign(s.xsize.size(), 0);
  if (zero < 2) return peak;
  // The replay walks every unit of every micro-batch: a few seconds at kMaxReplayedUnits.
  const double passes = double(micros) * double(s.size.size() + s.xsize.size());
  if (passes > kMaxReplayedUnits)
    fail("zero=%d: grad_accum %d x %zu parameter units = %.3g unit passes per step, more than the planner replays "
         "(at most %.0f (2^22); fewer micro-batches or layers per pipeline stage)", zero, micros,
         s.size.size() + s.xsize.size(), passes, kMaxReplayedUnits);
  // Each engine (a DataParallel) polls its own reductions and prefetches its own next unit.
  struct Engine {
    Engine(const std::vector<int64_t>& units, int ranks)
        : size(&units), D(ranks), gathered(units.size(), 0), grads(units.size(), 0), gathers(units.size(), 0) {}
    const std::vector<int64_t>* size;
    int D;
    std::vector<char> gathered, grads;
    std::deque<int> pending;
    int last = -1;
    std::vector<int> gathers;
  };
  Engine eng[2] = {Engine(s.size, D), Engine(s.xsize, D / std::max(ep, 1))};
  uint64_t p = 0, g = 0, c = 0;
  auto bump = [&] {
    peak.params = std::max(peak.params, p);
    peak.grads = std::max(peak.grads, g);
    peak.comm = std::max(peak.comm, c);
  };
  auto retire = [&](Engine& k) {  // the oldest reduction completes: its unit buffer and chunk are freed
    const size_t v = size_t(k.pending.front());
    k.pending.pop_front();
    g -= uint64_t((*k.size)[v]) * 4;
    c -= uint64_t((*k.size)[v] / k.D) * 4;
  };
  auto gather = [&](Engine& k, int u) {
    k.gathered[size_t(u)] = 1;
    k.gathers[size_t(u)]++;
    p += uint64_t((*k.size)[size_t(u)]) * cb;
  };
  for (int m = 0; m < micros; m++)  // the embeddings go as rows in the last micro-batch only
    for (const UnitEvent& e : micro_events(s, emb_rows && m + 1 == micros)) {
      Engine& k = eng[e.engine];
      const size_t u = size_t(e.unit), U = k.size->size();
      const uint64_t n = uint64_t((*k.size)[u]);
      if (e.kind == UnitEvent::acquire) {
        // The poll at each acquire finds every reduction but the newest complete: one unit's backward
        // hides a reduction (the bound of two in flight applies when the links are slower).
        const size_t keep = progress == Progress::instant ? 0 : progress == Progress::next_unit ? 1 : k.pending.size();
        while (k.pending.size() > keep) retire(k);
        if (e.grads && !k.grads[u]) {
          k.grads[u] = 1;
          g += n * 4;
        }
        if (zero == 3) {
          if (!k.gathered[u]) gather(k, e.unit);
          const int step = e.unit - k.last, next = e.unit + step;
          if ((step == 1 || step == -1) && next >= 0 && next < int(U) && !k.gathered[size_t(next)]) gather(k, next);
          k.last = e.unit;
        }
      } else if (e.kind == UnitEvent::release) {
        if (zero == 3 && k.gathered[u]) {
          k.gathered[u] = 0;
          p -= n * cb;
        }
      } else {
        k.pending.push_back(e.unit);
        k.grads[u] = 0;  // the buffer moves to the reduction
        c += n / uint64_t(k.D) * 4;
        bump();
        while (k.pending.size() > kMaxReductionsInFlight) retire(k);
      }
      bump();
    }
  peak.gathers = eng[0].gathers;
  peak.xgathers = eng[1].gathers;
  return peak;
}

// Bytes of the model's activation buffers for one micro-batch of this rank (model/gpt_pass.h).
struct ActModel {
  uint64_t layer_kept = 0;    // one layer's LayerActs under the recompute mode
  uint64_t layer_scratch = 0; // a LayerActs without attention state (full recompute's scratch)
  uint64_t att = 0;           // one layer's attention state (probabilities or log-sum-exp)
  uint64_t resid = 0;         // one (Ns, C) residual-stream buffer
  uint64_t all_rows = 0;      // one (N, C) buffer
  uint64_t att_scratch = 0;   // backward's attention workspace (fp32)
  uint64_t bwd_ws = 0;        // backward's per-layer gradient buffers
  uint64_t ring_fwd = 0, ring_bwd = 0;  // ring attention's buffers while a call runs (cp)
  uint64_t head = 0;          // last stage: lnf, its statistics, dlnf, the losses
  uint64_t logits = 0;        // one classifier chunk (and tp's softmax statistics)
};

ActModel act_model(const config::TrainOptions& o, const parallel::MeshLayout& l) {
  const model::GPTConfig& m = o.model;
  const size_t cb = dtype_size(o.precision);
  const int64_t B = o.batch_size, T = o.seq_len / l.cp, P = l.tp, C = m.n_embd;
  const int64_t N = B * T, Ns = o.sequence_parallel() ? N / P : N, Cl = C / P, NHl = m.n_head / P;
  const bool flash = o.attention_kind() == model::Attention::flash;
  const uint64_t lse = uint64_t(B * NHl * T) * 4, probs = uint64_t(B * NHl * T * T) * cb;
  ActModel a;
  a.resid = uint64_t(Ns * C) * cb;
  a.all_rows = uint64_t(N * C) * cb;
  a.att = flash ? lse : probs;
  const uint64_t stats = uint64_t(4 * Ns) * 4;  // the two LayerNorms' mean and rstd
  // ln1, res2, ln2 (Ns, C); qkv (N, 3Cl), atty (N, Cl); fch, fch_gelu (N, 4Cl); the LayerNorm statistics.
  a.layer_scratch = 3 * a.resid + uint64_t((3 + 1 + 8) * N * Cl) * cb + stats;
  a.layer_kept = a.layer_scratch + (o.recompute == model::Recompute::none ? a.att : 0);
  // The materialised backward's workspace: the CUDA kernels' dS of every pair; none on the CPU
  // (model/gpt_stage.cpp).
  a.att_scratch = flash ? lse : o.device == Device::cuda ? uint64_t(B * NHl * T * T) * 4 : 0;
  a.bwd_ws = a.resid + uint64_t((1 + 3 + 4) * N * Cl) * cb;  // dln; datty, dqkv, dfc
  if (l.cp > 1) {
    const uint64_t nkv = uint64_t(B * T * 2 * Cl), no = uint64_t(B * T * Cl), nl = uint64_t(B * NHl * T);
    const uint64_t docs = o.data.doc_mask ? 2 * uint64_t(B * T) * 4 : 0;
    a.ring_fwd = 2 * nkv * cb + docs + 2 * no * 4 + 2 * nl * 4;
    a.ring_bwd = nl * 4 + no * 4 + 2 * nkv * 4 + 2 * nkv * cb + docs + 3 * no * 4;  // + (B, Tl, 3C) fp32 dqkv
  }
  a.head = 2 * a.resid + uint64_t(2 * Ns) * 4 + uint64_t(N) * 4;
  const int64_t Vl = m.padded_vocab() / P;
  const int64_t rows = model::classifier_rows(o.device, int(N), int(Vl), size_t(cb));
  a.logits = uint64_t(rows * Vl) * cb + (P > 1 ? uint64_t(rows * 3 * (1 + P)) * 4 : 0);
  return a;
}

// Bytes of one mixture layer's buffers (model/gpt_moe.cpp) on this rank's Ns rows: what its forward
// keeps (MoeActs, in place of the dense MLP's fch and fch_gelu) and the transient peaks of its forward
// and backward beyond that. The kept rows M are every assignment when dropless; under a capacity they
// are the most the experts take (E x capacity, the micro-batch's over its token group shared evenly),
// and under expert parallelism the rows a rank's experts receive are taken as many as it sends (the
// routing balanced): both are a model, the routing decides.
struct MoeActModel {
  uint64_t kept = 0;
  uint64_t fwd = 0;  // the router's logits (and 16-bit weight copy), then the exchange's buffers
  uint64_t bwd = 0;  // the larger of the experts' backward and the router's
  // zb1, between B_input and W: what W reads of MoeActs (the router input, the rows, the hidden
  // states, the shared experts') and the gradients B_input left it (MoeGrads).
  uint64_t split = 0;
  uint64_t bwd_split = 0;  // zb1's B_input: the experts' gradients stay (for W) through the router's part
};

MoeActModel moe_act_model(const config::TrainOptions& o, const parallel::MeshLayout& l) {
  MoeActModel a;
  const model::MoeConfig& mc = o.model.moe;
  if (!mc.enabled()) return a;
  const uint64_t cb = dtype_size(o.precision);
  const int64_t N0 = int64_t(o.batch_size) * (o.seq_len / l.cp);
  const bool sp = o.sequence_parallel();
  const int64_t N = sp ? N0 / l.tp : N0, C = o.model.n_embd, F = 4 * C, E = mc.experts, K = mc.top_k;
  const int64_t A = N * K, G = int64_t(l.cp) * (sp ? l.tp : 1);  // the token group (moe/token_group.h)
  int64_t M = A;
  if (mc.capacity > 0) M = std::min<int64_t>(A, E * moe::expert_capacity(mc.capacity, int(N * G), int(K), int(E)) / G);
  const int64_t R = M;  // rows this rank's experts take under ep
  const uint64_t f32 = 4;
  const uint64_t plan = uint64_t(E + 1) * 8 + uint64_t(2 * E + 1 + 2 * A) * 4;
  const uint64_t x32 = cb != 4 ? uint64_t(N * C) * f32 : 0, w32 = cb != 4 ? uint64_t(E * C) * f32 : 0;
  a.kept = uint64_t(N * E + N + A) * f32 + plan + uint64_t(A) * 4 + x32 + (G > 1 ? uint64_t(E) * 4 : 0) +
           uint64_t(R * C + M * C + 2 * R * F) * cb + uint64_t(mc.shared) * 2 * uint64_t(N * F) * cb;
  const uint64_t logits = uint64_t(N * E) * f32, route = uint64_t(2 * N) * f32 + (mc.balance == model::MoeBalance::bias ? uint64_t(E) * f32 : 0);
  const uint64_t exchange = l.ep > 1 ? 2 * uint64_t(R * C) * cb : 0, shared = mc.shared > 0 ? uint64_t(N * C) * cb : 0;
  a.fwd = logits + w32 + std::max({route, exchange, shared});
  // Backward: the combine's row and gate gradients and the experts' (under ep the received rows'
  // gradients, their hidden states', the input gradients to send back and the staging), then the
  // router's logits and fp32 input gradients beside the shared experts' buffers.
  const uint64_t dgate = uint64_t(A) * f32, rows = uint64_t(M * C) * cb;
  const uint64_t experts = l.ep > 1 ? dgate + 2 * rows + uint64_t(3 * R * C + R * F) * cb : dgate + 2 * rows + uint64_t(M * F) * cb;
  const uint64_t router = dgate + rows + logits + uint64_t(N * C) * f32 + w32 +
                          (mc.shared > 0 ? uint64_t(N * C + N * F) * cb + x32 : 0);
  a.bwd = std::max(experts, router);
  const uint64_t shared_h = uint64_t(mc.shared) * uint64_t(N * F) * cb;
  a.bwd_split = std::max(experts, router + uint64_t(R * C + R * F) * cb + (mc.shared > 0 ? uint64_t(N * C) * cb : 0));
  a.split = x32 + uint64_t(R * C + R * F) * cb + shared_h +                      // rows, h, shared_h
            uint64_t(R * C + R * F) * cb + logits + shared_h +                   // d_out, d_h, d_logits, d_shared_fc
            (mc.shared > 0 ? uint64_t(N * C) * cb : 0);                          // d_x
  return a;
}

}  // namespace

uint64_t MemoryPlan::total() const {
  uint64_t t = nccl;
  for (uint64_t b : bytes) t += b;
  return t;
}

NcclConnections plan_nccl_connections(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank) {
  NcclConnections n;
  if (o.device != Device::cuda) return n;
  // The groups the trainer gives a device communicator, by the trainer's own rule (parallel/mesh.h);
  // the experts' data parallelism only on a stage that holds experts (one with mixture layers).
  const bool experts = experts_apart(o, l) && !stage_units(o, l, pp_rank).xsize.empty();
  for (int g = 0; g < parallel::kNumMeshGroups; g++) {
    const int size = parallel::device_comm_size(parallel::MeshGroup(g), o.device, l, o.parallel.zero, experts);
    const parallel::DeviceCommUse use = parallel::device_comm_use(parallel::MeshGroup(g), 0, size);
    n.rings += use.collectives ? 1 : 0;
    n.peers += int(use.peers.size());
  }
  return n;
}

uint64_t plan_nccl_bytes(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank,
                         const NcclAssumption& a) {
  const NcclConnections n = plan_nccl_connections(o, l, pp_rank);
  return uint64_t(n.rings + n.peers) * uint64_t(a.channels) * a.buff_bytes;
}

std::vector<int64_t> plan_units(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank) {
  return stage_units(o, l, pp_rank).size;
}

std::vector<int> plan_unit_gathers(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank) {
  const StageUnits s = stage_units(o, l, pp_rank);
  const int zero = o.parallel.zero;
  if (zero != 3) return std::vector<int>(s.size.size(), 0);
  return replay(s, zero, l.dp * l.cp, l.ep, dtype_size(o.precision), false, o.grad_accum).gathers;
}

std::vector<int64_t> plan_expert_units(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank) {
  return stage_units(o, l, pp_rank).xsize;
}

std::vector<int> plan_expert_unit_gathers(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank) {
  const StageUnits s = stage_units(o, l, pp_rank);
  const int zero = o.parallel.zero;
  if (zero != 3) return std::vector<int>(s.xsize.size(), 0);
  return replay(s, zero, l.dp * l.cp, l.ep, dtype_size(o.precision), false, o.grad_accum).xgathers;
}

bool plan_embedding_rows(const config::TrainOptions& o, const parallel::MeshLayout& l) {
  return o.parallel.embedding_rows && l.tp == 1 && l.pp == 1 && l.dp * l.cp > 1 && o.parallel.zero <= 2 &&
         o.device == Device::cpu;
}

PipelineFigures pipeline_figures(const config::TrainOptions& o, const parallel::MeshLayout& l) {
  PipelineFigures f;
  if (l.pp == 1) return f;
  const parallel::Schedule schedule = parallel::build_schedule(config::pipeline_spec(o));
  const parallel::Simulation sim = parallel::simulate(schedule, parallel::PipelineCosts());
  f.bubble_over_ideal = sim.bubble_over_ideal();
  for (int r = 0; r < l.pp; r++) f.peak_micro_batches.push_back(sim.peak_activations(r));
  f.held.resize(size_t(l.pp));
  f.split = config::pipeline_spec(o).kind == parallel::ScheduleKind::zb1;
  for (int r = 0; r < l.pp; r++) {
    PipelineFigures::Held h;
    for (const parallel::Action& a : schedule.ranks[size_t(r)]) {
      switch (a.kind) {
        case parallel::ActionKind::forward:
          h.forward++;
          f.held[size_t(r)].push_back(h);
          break;
        case parallel::ActionKind::backward_input:
          h.in_b = true;
          f.held[size_t(r)].push_back(h);
          h.in_b = false, h.forward--, h.split++;
          f.held[size_t(r)].push_back(h);
          break;
        case parallel::ActionKind::backward_weight: h.split--; break;
        case parallel::ActionKind::backward: h.forward--; break;
        default: break;
      }
    }
  }
  return f;
}

MemoryPlan plan_memory(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank) {
  return plan_memory(o, l, pp_rank, pipeline_figures(o, l));
}

MemoryPlan plan_memory(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank, const PipelineFigures& pipe) {
  MT_CHECK(pp_rank >= 0 && pp_rank < l.pp, "plan_memory: pipeline rank %d of %d", pp_rank, l.pp);
  const StageUnits s = stage_units(o, l, pp_rank);
  const int D = l.dp * l.cp, zero = o.parallel.zero;
  const uint64_t cb = dtype_size(o.precision);
  uint64_t total = 0, xtotal = 0;
  for (int64_t n : s.size) total += uint64_t(n);
  for (int64_t n : s.xsize) xtotal += uint64_t(n);
  // The experts held apart are sharded over their expert-data group (D / ep ranks), the rest over D;
  // both engines hold the same kinds of state, so the formulas below take their sums.
  const uint64_t shard = (zero == 0 ? total : total / uint64_t(D)) +
                         (zero == 0 || xtotal == 0 ? xtotal : xtotal / uint64_t(D / l.ep));
  total += xtotal;
  const bool emb_rows = plan_embedding_rows(o, l);
  const Transients t = replay(s, zero, D, l.ep, cb, emb_rows, o.grad_accum);
  MemoryPlan mp;
  mp.pp_rank = pp_rank;
  auto& b = mp.bytes;
  const auto cat = [](MemCategory c) { return size_t(c); };
  // Model state.
  if (zero == 0) {
    b[cat(MemCategory::params)] = total * 4 + (cb != 4 ? total * cb : 0);
    b[cat(MemCategory::grads)] = total * 4;
  } else {
    b[cat(MemCategory::params)] = shard * 4 + (zero < 3 ? total * cb : (cb != 4 ? shard * cb : 0)) + t.params;
    b[cat(MemCategory::grads)] = shard * 4 + (zero < 2 ? total * 4 : t.grads);
  }
  if (zero >= 2) {
    mp.grads_least = shard * 4 + replay(s, zero, D, l.ep, cb, emb_rows, o.grad_accum, Progress::instant).grads;
    mp.grads_bound = shard * 4 + replay(s, zero, D, l.ep, cb, emb_rows, o.grad_accum, Progress::bound).grads;
  }
  b[cat(MemCategory::optimizer)] = 2 * shard * 4 + kStepScalarsBytes;
  // The MPI communicators stage a host reduction's data in reusable buffers: the largest all-reduce
  // of ZeRO 0-1 (a bucket), one (N, C) activation of tp. An estimate: which other collectives stage
  // depends on the transport.
  uint64_t staging = 0;
  if (D > 1 && zero <= 1) staging = std::min<uint64_t>(total * 4, uint64_t(o.parallel.bucket_mb * 1024 * 1024) + *std::max_element(s.size.begin(), s.size.end()) * 4);
  if (l.tp > 1) staging = std::max<uint64_t>(staging, uint64_t(o.batch_size) * (o.seq_len / l.cp) * o.model.n_embd * cb);
  if (o.sequence_parallel() && s.moe_layers > 0) {
    // A mixture layer's partial gradients over tp: its second LayerNorm's, router's and the experts'
    // the store holds, one all-reduce (plan/cost.cpp tp_traffic).
    const model::MoeConfig& mc = o.model.moe;
    const uint64_t C = uint64_t(o.model.n_embd), E = uint64_t(mc.experts), mlp = 8 * C * C + 5 * C;
    const bool apart = experts_apart(o, l);
    staging = std::max<uint64_t>(staging, (2 * C + E * C + (uint64_t(mc.shared) + (apart ? 0 : E)) * mlp) * 4);
  }
  // Under pp the first and the last stage receive the other copy's part of wte's gradient (fp32, this
  // rank's dp shard of it) into arena memory before adding it (train/pipeline.cpp sum_tied_grads).
  uint64_t tied = 0;
  if (l.pp > 1 && (s.first || s.last) && s.emb >= 0) {
    const uint64_t wte = uint64_t(s.size[size_t(s.emb)]);
    tied = (zero == 0 ? wte : (wte + uint64_t(D) - 1) / uint64_t(D)) * 4;
  }
  // A norm scalar per data-parallel engine (the experts held apart have their own).
  b[cat(MemCategory::comm)] = sizeof(double) * (s.xsize.empty() ? 1 : 2) + t.comm + staging + tied;
  // Activations: what each micro-batch keeps, times the micro-batches in flight, plus the workspace of
  // the pass at the peak (backward of the top layer, or the classifier at the end of the forward).
  const ActModel a = act_model(o, l);
  const int n = int(s.layers.size()), nm = s.moe_layers;
  const bool keep = o.recompute != model::Recompute::full;
  // A mixture layer keeps its MoeActs instead of the dense MLP's two (N, 4C/tp) buffers; under full
  // recompute the one being rebuilt lives beside the dense scratch.
  const MoeActModel x = moe_act_model(o, l);
  const uint64_t ncl = uint64_t(o.batch_size) * uint64_t(o.seq_len / l.cp) * uint64_t(o.model.n_embd / l.tp) * cb;
  const uint64_t dense_mlp = 8 * ncl;
  uint64_t stash = uint64_t(n + 1) * a.resid + (s.last ? a.head : 0) +
                   (keep ? uint64_t(n) * a.layer_kept - uint64_t(nm) * dense_mlp + uint64_t(nm) * x.kept : 0);
  const uint64_t moe_scratch = nm > 0 && !keep ? x.kept : 0;
  const bool split = l.pp > 1 && pipe.split;  // zb1's B_input and W (below)
  const bool sp = o.sequence_parallel();
  const uint64_t shared_att = o.recompute == model::Recompute::none ? 0 : a.att;
  const uint64_t fwd_ws = (sp ? 2 * a.all_rows : 0) + shared_att + (keep ? 0 : a.layer_scratch) + moe_scratch +
                          std::max(s.last ? a.logits : 0, nm > 0 ? x.fwd : 0) + a.ring_fwd;
  // Backward frees the last stage's lnf and dlnf, allocates its workspace (and the last stage's dx),
  // then in the top layer frees the stage output while the layer's own buffers (sp's gathered output
  // gradient, ring attention's blocks) come and go: the peak is before the loop or inside it.
  const uint64_t bwd_pre = (sp ? 2 * a.all_rows : 0) + shared_att + (keep ? 0 : a.layer_scratch + a.resid) +
                           a.att_scratch + a.bwd_ws - (split ? 7 * ncl : 0) + (s.last ? a.resid : 0);
  // A mixture layer's own backward buffers come and go before its attention's (and under full
  // recompute after its forward's).
  const uint64_t moe_in_layer = nm > 0 ? std::max(keep ? 0 : x.fwd, split ? x.bwd_split : x.bwd) : 0;
  const uint64_t bwd_in_layer = moe_scratch + std::max((sp ? a.all_rows : 0) + a.ring_bwd, moe_in_layer);
  const uint64_t head_freed = s.last ? 2 * a.resid : 0;
  const uint64_t bwd_ws = bwd_pre + std::max(a.resid, bwd_in_layer) - a.resid;  // net of the stage output
  // zb1: after B_input a micro-batch keeps what W reads (model/gpt_stage.cpp backward with split):
  // each layer's input (not the stage's output), its activations but qkv, the attention state and
  // fch (under full recompute the rebuilt ones), and the gradients of the weighted ops' outputs
  // (LayerGrads; a mixture layer's MoeGrads); the last stage's lnf and its gradient are gone. Its
  // backward allocates no dqkv or dfc workspace (each layer's LayerGrads take them).
  const uint64_t split_stash = uint64_t(n) * a.resid + (s.last ? a.head - 2 * a.resid : 0) +
                               uint64_t(n) * (a.layer_scratch + 2 * a.all_rows + 2 * a.resid) -
                               uint64_t(nm) * (dense_mlp + a.all_rows) + uint64_t(nm) * x.split;
  // Inside B_input the top layer's LayerGrads are allocated before its qkv, attention state and fch
  // go: the micro-batch holds its whole stash and them (a mixture layer's MoeGrads come and go with
  // its backward's buffers, counted there).
  // The stage's output goes first; under full recompute the layer rebuilt for W is held beside them.
  const uint64_t top_grads = (n > nm ? 2 * a.all_rows + a.resid + 7 * ncl : a.all_rows + a.resid + 3 * ncl) +
                             (keep ? 0 : a.layer_scratch);
  double in_flight = 1;
  if (l.pp > 1) in_flight = std::max(1.0, pipe.peak_micro_batches[size_t(pp_rank)]);
  // Pipeline messages beyond the stash: the receive posted for the next action, a non-last stage's
  // incoming gradient (it becomes the stage's dx), and a non-first stage's gradient send in flight.
  const uint64_t messages = l.pp > 1 ? uint64_t(1 + !s.last + !s.first) * a.resid : 0;
  // The last stage keeps every micro-batch's per-token losses (fp32) until the step's end.
  const uint64_t losses =
      l.pp > 1 && s.last ? uint64_t(o.grad_accum) * uint64_t(o.batch_size) * uint64_t(o.seq_len / l.cp) * 4 : 0;
  mp.in_flight = in_flight;
  mp.stash_per_micro = stash;
  const uint64_t bwd_net = bwd_ws > head_freed ? bwd_ws - head_freed : 0;
  mp.workspace = std::max(fwd_ws, bwd_net);
  uint64_t peak = uint64_t(double(stash) * in_flight + 0.5) + mp.workspace;
  if (split) {
    // The peak is at one point of the rank's actions: the end of a forward (its workspace beside
    // what is held) or inside a B_input (the top layer's gradients and the backward's workspace).
    const double v = double(config::pipeline_spec(o).v);
    double most = 0;
    for (const PipelineFigures::Held& h : pipe.held[size_t(pp_rank)]) {
      const double held = (h.forward - (h.in_b ? 1 : 0)) * double(stash) + h.split * double(split_stash) +
                          (h.in_b ? double(std::max(stash + top_grads, split_stash)) : 0);
      most = std::max(most, held / v + double(h.in_b ? bwd_net : fwd_ws));
    }
    peak = uint64_t(most + 0.5);
    mp.split_stash = split_stash;
  }
  b[cat(MemCategory::activations)] = peak + messages + losses;
  mp.nccl = plan_nccl_bytes(o, l, pp_rank);
  return mp;
}

MemoryPlan plan_memory_worst(const config::TrainOptions& o, const parallel::MeshLayout& l) {
  return plan_memory_worst(o, l, pipeline_figures(o, l));
}

MemoryPlan plan_memory_worst(const config::TrainOptions& o, const parallel::MeshLayout& l, const PipelineFigures& pipe) {
  MemoryPlan best = plan_memory(o, l, 0, pipe);
  for (int r = 1; r < l.pp; r++) {
    MemoryPlan m = plan_memory(o, l, r, pipe);
    if (m.total() > best.total()) best = m;
  }
  return best;
}

}  // namespace mt::plan
