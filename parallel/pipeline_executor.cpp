#include "parallel/pipeline_executor.h"

#include <chrono>
#include <string>

#include "runtime/check.h"

namespace mt::parallel {

namespace {
using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

bool is_receive(ActionKind k) { return k == ActionKind::recv_activation || k == ActionKind::recv_gradient; }
}  // namespace

void PipelineExecutor::set_trace(Trace* trace) {
  trace_ = trace;
  if (trace_) trace_lane_ = trace_->lane("pipeline");
}

// A compute action's span name: F3, B3, Bi3 (B_input), W3; c1F3 for chunk 1 when a rank has several.
std::string PipelineExecutor::action_name(const Action& a) const {
  if (!trace_ || !trace_->recording()) return {};
  const char* k = a.kind == ActionKind::backward_input ? "Bi" : action_kind_name(a.kind);
  return (schedule_.v() > 1 ? "c" + std::to_string(a.chunk) : std::string()) + k + std::to_string(a.micro);
}

Pairing pairing_for(const Comm& pp) { return pp.device() == Device::cpu ? Pairing::ahead : Pairing::paired; }

PipelineExecutor::PipelineExecutor(Schedule schedule, Comm& pp, Pairing pairing)
    : schedule_(std::move(schedule)), pp_(pp), pairing_(pairing) {
  MT_CHECK(pp.size() == schedule_.p(), "pipeline executor: a schedule for %d ranks on a communicator of %d",
           schedule_.p(), pp.size());
  if (pairing_ == Pairing::paired) {
    check_exchanges(schedule_);
    exchanges_ = paired_exchanges(schedule_, pp.rank());
  }
  last_forward_.assign(size_t(schedule_.v()), 0);
  last_backward_.assign(size_t(schedule_.v()), 0);
  last_weight_.assign(size_t(schedule_.v()), 0);
  const std::vector<Action>& list = actions();
  for (size_t i = 0; i < list.size(); i++) {
    const size_t c = size_t(list[i].chunk);
    if (list[i].kind == ActionKind::forward) last_forward_[c] = i;
    if (list[i].kind == ActionKind::backward || list[i].kind == ActionKind::backward_input) last_backward_[c] = i;
    if (list[i].kind == ActionKind::backward_weight) last_weight_[c] = i;
  }
}

// Posts, in list order, every receive listed before `end` that is not posted yet.
void PipelineExecutor::post_receives_through(size_t end, PipelineStages& stages) {
  const std::vector<Action>& list = actions();
  for (; posted_ < end && posted_ < list.size(); posted_++) {
    const Action& a = list[posted_];
    if (!is_receive(a.kind)) continue;
    Message m;
    m.buf = stages.alloc_message();
    m.handle = pp_.recv_async(m.buf.data(), stages.message_elems(), stages.message_dtype(), a.peer);
    const bool fresh = received_.emplace(Key{a.kind, a.chunk, a.micro}, std::move(m)).second;
    MT_CHECK(fresh, "pipeline executor: %s received twice", describe(a).c_str());
    stats_.messages_received++;
  }
}

// The output of F or B that send action `send` carries, taken over from produced_.
Buffer PipelineExecutor::take_produced(const Action& send) {
  const ActionKind made = send.kind == ActionKind::send_activation ? ActionKind::forward : ActionKind::backward;
  auto it = produced_.find(Key{made, send.chunk, send.micro});
  MT_CHECK(it != produced_.end(), "pipeline executor: %s before its producer", describe(send).c_str());
  Buffer b = std::move(it->second);
  produced_.erase(it);
  return b;
}

// Paired: issues, in order, every exchange due before list index `before` (the list's size: all).
void PipelineExecutor::exchange_through(size_t before, PipelineStages& stages) {
  const std::vector<Action>& list = actions();
  const size_t n = stages.message_elems();
  const DType t = stages.message_dtype();
  for (; next_exchange_ < exchanges_.size() && exchanges_[next_exchange_].before <= before; next_exchange_++) {
    const Exchange& x = exchanges_[next_exchange_];
    Buffer out;
    if (x.send >= 0) {
      out = take_produced(list[size_t(x.send)]);
      stats_.messages_sent++;
    }
    if (x.recv < 0) {
      Message m;
      m.handle = pp_.send_async(out.data(), n, t, list[size_t(x.send)].peer);
      m.buf = std::move(out);
      sending_.push_back(std::move(m));
      continue;
    }
    const Action& r = list[size_t(x.recv)];
    Message m;
    m.buf = stages.alloc_message();
    if (x.send >= 0) {
      m.handle = pp_.send_recv_async(out.data(), n, list[size_t(x.send)].peer, m.buf.data(), n, r.peer, t);
      m.sent = std::move(out);
    } else {
      m.handle = pp_.recv_async(m.buf.data(), n, t, r.peer);
    }
    const bool fresh = received_.emplace(Key{r.kind, r.chunk, r.micro}, std::move(m)).second;
    MT_CHECK(fresh, "pipeline executor: %s received twice", describe(r).c_str());
    stats_.messages_received++;
  }
}

// The message `kind` (a receive) that compute action `a` consumes, once it has arrived; empty when
// the schedule lists none (stage 0's input, the last stage's output gradient).
Buffer PipelineExecutor::take_received(ActionKind kind, const Action& a) {
  auto it = received_.find(Key{kind, a.chunk, a.micro});
  if (it == received_.end()) return Buffer();
  const auto t0 = clock_type::now();
  it->second.handle.wait();
  stats_.recv_wait_s += since(t0);
  Buffer b = std::move(it->second.buf);
  received_.erase(it);
  return b;
}

void PipelineExecutor::reap_sends(bool wait) {
  const auto t0 = clock_type::now();
  for (size_t i = 0; i < sending_.size();) {
    if (wait) sending_[i].handle.wait();
    if (sending_[i].handle.done() || sending_[i].handle.test()) {
      sending_[i] = std::move(sending_.back());
      sending_.pop_back();
    } else {
      i++;
    }
  }
  if (wait) stats_.send_wait_s += since(t0);
}

void PipelineExecutor::set_timers(std::unique_ptr<ops::OpTimer> span, std::unique_ptr<ops::OpTimer> compute) {
  MT_CHECK((span == nullptr) == (compute == nullptr), "pipeline executor: both device timers or neither");
  span_timer_ = std::move(span);
  compute_timer_ = std::move(compute);
}

const PipelineStats& PipelineExecutor::stats() {
  if (device_times_pending_) resolve_device_times();
  return stats_;
}

// The device's figures of the last run, in place of the host clock's (waits for the device).
void PipelineExecutor::resolve_device_times() {
  device_times_pending_ = false;
  stats_.run_s = stats_.compute_s = stats_.forward_s = stats_.backward_s = 0;
  for (const ops::OpTotal& t : span_timer_->totals()) stats_.run_s += t.seconds;
  for (const ops::OpTotal& t : compute_timer_->totals()) {
    (t.op == std::string("F") ? stats_.forward_s : stats_.backward_s) += t.seconds;
    stats_.compute_s += t.seconds;
  }
}

void PipelineExecutor::run(PipelineStages& stages) {
  stats_ = PipelineStats();
  device_times_pending_ = false;
  if (span_timer_) {
    span_timer_->reset();
    compute_timer_->reset();
    span_timer_->begin("pipeline", 0);
  }
  const auto t_run = clock_type::now();
  posted_ = 0;
  next_exchange_ = 0;
  const bool paired = pairing_ == Pairing::paired;
  MT_CHECK(received_.empty() && produced_.empty() && sending_.empty(), "pipeline executor: a step left messages");
  const std::vector<Action>& list = actions();
  for (size_t i = 0; i < list.size(); i++) {
    const Action& a = list[i];
    switch (a.kind) {
      case ActionKind::recv_activation:
      case ActionKind::recv_gradient:
        if (!paired) post_receives_through(i + 1, stages);  // paired: in the next exchange
        break;
      case ActionKind::send_activation:
      case ActionKind::send_gradient: {
        if (paired) break;  // in the next exchange
        Message m;
        m.buf = take_produced(a);
        m.handle = pp_.send_async(m.buf.data(), stages.message_elems(), stages.message_dtype(), a.peer);
        sending_.push_back(std::move(m));
        stats_.messages_sent++;
        break;
      }
      case ActionKind::forward:
      case ActionKind::backward:
      case ActionKind::backward_input: {
        if (paired) {
          exchange_through(i, stages);
        } else {
          // Post the next compute action's receives now, so that they land while this one runs.
          size_t next = i + 1;
          while (next < list.size() && !is_compute(list[next].kind)) next++;
          post_receives_through(next, stages);
        }
        const bool fwd = a.kind == ActionKind::forward;
        Buffer in = take_received(fwd ? ActionKind::recv_activation : ActionKind::recv_gradient, a);
        stages.before(a, i == (fwd ? last_forward_ : last_backward_)[size_t(a.chunk)]);
        const auto t0 = clock_type::now();
        const Trace::Span span(trace_, trace_lane_, "pipeline", action_name(a));
        if (compute_timer_) compute_timer_->begin(fwd ? "F" : "B", 0);
        Buffer out = fwd                                    ? stages.forward(a.chunk, a.micro, std::move(in))
                     : a.kind == ActionKind::backward_input ? stages.backward_input(a.chunk, a.micro, std::move(in))
                                                            : stages.backward(a.chunk, a.micro, std::move(in));
        if (compute_timer_) compute_timer_->end();
        const double dt = since(t0);
        stats_.compute_s += dt;
        (fwd ? stats_.forward_s : stats_.backward_s) += dt;
        (fwd ? stats_.forwards : stats_.backwards)++;
        // B_input's output is sent as B's would be (send_gradient finds it under B).
        if (out) produced_[Key{fwd ? ActionKind::forward : ActionKind::backward, a.chunk, a.micro}] = std::move(out);
        reap_sends(false);
        break;
      }
      case ActionKind::backward_weight: {
        if (paired) exchange_through(i, stages);  // W consumes nothing; its exchanges send B_input's output
        stages.before(a, i == last_weight_[size_t(a.chunk)]);
        const auto t0 = clock_type::now();
        const Trace::Span span(trace_, trace_lane_, "pipeline", action_name(a));
        if (compute_timer_) compute_timer_->begin("W", 0);
        stages.backward_weight(a.chunk, a.micro);
        if (compute_timer_) compute_timer_->end();
        const double dt = since(t0);
        stats_.compute_s += dt;
        stats_.backward_s += dt;
        reap_sends(false);
        break;
      }
    }
  }
  if (paired) exchange_through(list.size(), stages);  // the sends after the last compute action
  reap_sends(true);
  stats_.run_s = since(t_run);
  if (span_timer_) {
    span_timer_->end();
    device_times_pending_ = true;
  }
  MT_CHECK(received_.empty(), "pipeline executor: %zu received messages were never consumed", received_.size());
  // An output nobody sends is a local hand-over the schedule does not list (one rank, several chunks).
  MT_CHECK(produced_.empty(), "pipeline executor: %zu outputs were never sent", produced_.size());
}

}  // namespace mt::parallel
