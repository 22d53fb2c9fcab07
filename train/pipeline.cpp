#include "train/pipeline.h"

#include <algorithm>
#include <sstream>

#include "kernels/ops.h"
#include "parallel/pipeline_exchange.h"
#include "parallel/pipeline_sim.h"
#include "runtime/check.h"

namespace mt::train {

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
    // The executor pairs each compute action's messages into one exchange, which some schedules
    // cannot run without deadlock when sends wait for their receives (parallel/pipeline_exchange.h).
    try {
      parallel::check_exchanges(parallel::build_schedule(pipeline_spec(o)));
    } catch (const Error& e) {
      fail("pp.schedule=%s with %s (--pp %d, grad_accum %d, pp.virtual %d): its messages cannot run as paired "
           "exchanges without deadlock under NCCL (%s); use gpipe, 1f1b or zb1",
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

namespace {
parallel::Schedule checked_schedule(const TrainOptions& o) {
  parallel::Schedule s = parallel::build_schedule(pipeline_spec(o));
  parallel::validate_schedule(s);
  return s;
}
}  // namespace

Pipeline::Pipeline(const TrainOptions& o, parallel::Comm& pp, parallel::Comm& messages, model::GPT& gpt,
                   ParamStore& store, parallel::DataParallel& dp, Arena& arena, const ops::Ctx& ctx)
    : pp_(pp),
      msg_(messages),
      gpt_(gpt),
      store_(store),
      dp_(dp),
      arena_(arena),
      ctx_(ctx),
      exec_(checked_schedule(o), messages, pipeline_pairing(o)) {
  MT_CHECK(messages.device() == arena.device() && messages.size() == pp.size() && messages.rank() == pp.rank(),
           "pipeline: messages on communicator '%s' (%s) for a run in %s memory", messages.name().c_str(),
           device_name(messages.device()), device_name(arena.device()));
  MT_CHECK(parallel::pairing_for(messages) == parallel::Pairing::ahead || exec_.pairing() == parallel::Pairing::paired,
           "pipeline: a device communicator ('%s') needs paired exchanges", messages.name().c_str());
  gpt_.set_keep_stage_losses(true);
}

Buffer Pipeline::alloc_message() {
  return arena_.alloc_uninitialized(MemCategory::activations, elems_ * dtype_size(store_.compute_dtype()));
}

void Pipeline::before(const parallel::Action& a, bool last) {
  (void)a;
  dp_.set_last_micro(last);
  if (xdp_) xdp_->set_last_micro(last);
}

Buffer Pipeline::forward(int chunk, int micro, Buffer input) {
  const HostBatch& b = (*micro_)[size_t(micro)];
  std::unique_ptr<model::StageContext> ctx = gpt_.stage_forward(chunk, view(b), std::move(input), dloss_, true);
  Buffer out = gpt_.take_stage_output(*ctx);
  contexts_[{chunk, micro}] = std::move(ctx);
  return out;
}

model::StageContext& Pipeline::context(int chunk, int micro, const char* action) {
  auto it = contexts_.find({chunk, micro});
  MT_CHECK(it != contexts_.end(), "pipeline: %s of chunk %d, micro-batch %d before its forward", action, chunk, micro);
  return *it->second;
}

Buffer Pipeline::backward(int chunk, int micro, Buffer dy) {
  Buffer dx = backward_input_or_whole(chunk, micro, std::move(dy), false);
  contexts_.erase({chunk, micro});
  return dx;
}

Buffer Pipeline::backward_input(int chunk, int micro, Buffer dy) {
  return backward_input_or_whole(chunk, micro, std::move(dy), true);
}

Buffer Pipeline::backward_input_or_whole(int chunk, int micro, Buffer dy, bool split) {
  model::StageContext& ctx = context(chunk, micro, split ? "B_input" : "backward");
  Buffer dx = split ? gpt_.stage_backward_input(ctx, std::move(dy)) : gpt_.stage_backward(ctx, std::move(dy));
  const bool last_stage = gpt_.plan().last && chunk + 1 == int(gpt_.plan().chunks.size());
  if (last_stage) {
    // Copied into the step's buffer on the device's stream; summed on the host once, by loss_sum.
    const Buffer l = gpt_.take_stage_losses(ctx);
    if (!losses_) {
      loss_bytes_ = l.bytes();
      losses_ = arena_.alloc_uninitialized(MemCategory::activations, loss_bytes_ * micro_->size());
    }
    MT_CHECK(l.bytes() == loss_bytes_, "pipeline: micro-batch %d has %zu bytes of losses, not %zu", micro, l.bytes(),
             loss_bytes_);
    arena_.mem().move(static_cast<char*>(losses_.data()) + loss_bytes_ * size_t(micro), l.data(), loss_bytes_);
    loss_taken_[size_t(micro)] = 1;
  }
  return dx;
}

void Pipeline::backward_weight(int chunk, int micro) {
  gpt_.stage_backward_weight(context(chunk, micro, "W"));
  contexts_.erase({chunk, micro});
}

void Pipeline::step(const std::vector<HostBatch>& micro, float dloss) {
  micro_ = &micro;
  dloss_ = dloss;
  losses_.reset();
  loss_taken_.assign(micro.size(), 0);
  elems_ = size_t(gpt_.stage_activation_elems(view(micro[0])));
  exec_.run(*this);
  MT_CHECK(contexts_.empty(), "pipeline: %zu stage contexts left after the step", contexts_.size());
  micro_ = nullptr;
}

double Pipeline::loss_sum() {
  if (!losses_) return 0;  // not the last stage
  for (size_t k = 0; k < loss_taken_.size(); k++)
    MT_CHECK(loss_taken_[k], "pipeline: no loss for micro-batch %zu on the last stage", k);
  std::vector<float> host(losses_.bytes() / sizeof(float));
  arena_.mem().download(host.data(), losses_.data(), losses_.bytes());
  losses_.reset();
  const size_t n = loss_bytes_ / sizeof(float);
  double sum = 0;  // each micro-batch's tokens in order (GPT's own sum), then the micro-batches in order
  for (size_t k = 0; k < loss_taken_.size(); k++) {
    double mb = 0;
    for (size_t i = 0; i < n; i++) mb += double(host[k * n + i]);
    sum += mb;
  }
  return sum;
}

nlohmann::json Pipeline::step_json() {
  const parallel::PipelineStats& s = exec_.stats();  // device timers: waits for the device once
  constexpr size_t kFields = 4;
  const double mine[kFields] = {s.run_s, s.compute_s, s.forward_s / std::max(1, s.forwards),
                                s.backward_s / std::max(1, s.backwards)};
  const int p = pp_.size();
  std::vector<double> all(kFields * size_t(p));
  pp_.all_gather(mine, all.data(), kFields * 4, DType::u16);  // each double bit for bit
  // The step's pipeline phase: the longest rank's run of the schedule (the ranks start together, after
  // the previous step's collectives), as the simulator's makespan. A rank that finishes early is idle
  // until then: it waits in the step's next collective instead.
  double window = 0, f = 0, b = 0, mean = 0;
  for (int r = 0; r < p; r++) window = std::max(window, all[kFields * size_t(r)]);
  std::vector<double> bubble, idle;
  for (int r = 0; r < p; r++) {
    const double* x = all.data() + kFields * size_t(r);
    idle.push_back(window - x[1]);
    bubble.push_back(window > 0 ? idle.back() / window : 0);
    mean += bubble.back() / p;
    f += x[2] / p;
    b += x[3] / p;
  }
  return {{"bubble", mean}, {"bubble_ranks", bubble}, {"idle_s", idle}, {"forward_s", f}, {"backward_s", b}};
}

double Pipeline::forward_loss(const HostBatch& b) {
  const int p = pp_.size(), r = pp_.rank(), v = int(gpt_.plan().chunks.size()), S = p * v;
  elems_ = size_t(gpt_.stage_activation_elems(view(b)));
  double loss = 0;
  std::vector<parallel::CommHandle> sends;
  std::vector<Buffer> sent;
  for (int c = 0; c < v; c++) {
    const int s = c * p + r;
    Buffer in;
    // Every rank issues its messages in stage order, each the next one its peer waits for: a chain,
    // safe under rendezvous sends too (NCCL).
    if (s > 0) {
      in = alloc_message();
      msg_.recv(in.data(), elems_, message_dtype(), (s - 1) % p);
    }
    std::unique_ptr<model::StageContext> ctx = gpt_.stage_forward(c, view(b), std::move(in), 0.f, false);
    if (s == S - 1) {
      loss = gpt_.stage_loss(*ctx);  // eval: summed on the host (a device waits here, once per batch)
    } else {
      sent.push_back(gpt_.take_stage_output(*ctx));
      sends.push_back(msg_.send_async(sent.back().data(), elems_, message_dtype(), (s + 1) % p));
    }
  }
  for (parallel::CommHandle& h : sends) h.wait();
  return loss;
}

void Pipeline::sum_tied_grads() {
  const int p = pp_.size(), r = pp_.rank();
  if (p == 1 || (r != 0 && r != p - 1)) return;
  const int u = gpt_.embedding_unit();
  MT_CHECK(u >= 0, "pipeline: the first or last stage without the embedding unit");
  const ParamUnit& unit = store_.units()[size_t(u)];
  // Where this rank keeps its part of the unit's reduced gradient (all of it under ZeRO-0).
  float* g = nullptr;
  int64_t n = 0, pos = 0;
  for (const parallel::Segment& seg : dp_.segments()) {
    const int64_t lo = std::max(seg.begin, unit.begin), hi = std::min(seg.end, unit.end);
    if (hi > lo) {
      g = dp_.grad_shard() + pos + (lo - seg.begin);
      n = hi - lo;
      break;
    }
    pos += seg.size();
  }
  MT_CHECK(g != nullptr, "pipeline: no part of wte's gradient on this rank");
  const int peer = r == 0 ? p - 1 : 0;
  // The other copy's part lands in arena memory and is added where the gradient lives (a device
  // kernel on GPUs): g + other on one rank, other + g on its peer, the same bits (IEEE addition
  // commutes).
  Buffer other = arena_.alloc_uninitialized(MemCategory::comm, size_t(n) * sizeof(float));
  msg_.send_recv(g, size_t(n), peer, other.data(), size_t(n), peer, DType::f32);
  ops::add(g, g, other.f32(), n, ctx_);
}

}  // namespace mt::train
