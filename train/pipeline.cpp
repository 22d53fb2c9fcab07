#include "train/pipeline.h"

#include <algorithm>

#include "config/layout_rules.h"
#include "kernels/ops.h"
#include "parallel/pipeline_sim.h"
#include "runtime/check.h"

namespace mt::train {

namespace {
parallel::Schedule checked_schedule(const config::TrainOptions& o) {
  parallel::Schedule s = parallel::build_schedule(config::pipeline_spec(o));
  parallel::validate_schedule(s);
  return s;
}
}  // namespace

Pipeline::Pipeline(const config::TrainOptions& o, parallel::Comm& pp, parallel::Comm& messages, model::GPT& gpt,
                   ParamStore& store, parallel::DataParallel& dp, Arena& arena, const ops::Ctx& ctx)
    : pp_(pp),
      msg_(messages),
      gpt_(gpt),
      store_(store),
      dp_(dp),
      arena_(arena),
      ctx_(ctx),
      exec_(checked_schedule(o), messages, config::pipeline_pairing(o)) {
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
