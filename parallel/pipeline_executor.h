// The pipeline executor: runs this rank's action list of a Schedule (parallel/pipeline_schedule.h) for
// one optimizer step over the pipeline communicator's point-to-point operations.
//
// Who holds what. The executor knows nothing of the model: a PipelineStages object (the trainer's,
// over the GPT's stage calls) runs F and B of a chunk on a micro-batch and owns the saved contexts.
// The executor owns the messages: the activations received for F and the gradients received for B,
// and the outputs of F and B until their sends complete. Messages are one residual stream each
// (B T C elements, B T C / tp under sequence parallelism) in the run's storage type.
//
// Communication and its pairs: send_activation -> recv_activation (forward), send_gradient ->
// recv_gradient (the backward twin). Two ways to issue them (Pairing):
//
// ahead (host communicators: MPI's sends are eager). Following the schedule's contract: every
// receive is posted (recv_async) one compute action ahead of where it is listed, so the message
// lands while the rank computes; per peer they are posted in list order, so the k-th send from a
// rank matches the k-th receive from it, with one tag. A send starts when listed (send_async) and is
// completed only at the end of the step, or when it is seen complete, which frees its buffer; no
// send is waited for before a later action, so the validator's proof of deadlock freedom (eager
// sends, blocking receives) applies. Per step a rank sends m v messages each way, a = B T C elements
// each (first and last stage excepted for gradients and activations respectively).
//
// paired (device communicators: NCCL's sends wait for their receives, and its operations run in
// issue order on one stream, so a receive posted ahead would hold up the sends queued behind it).
// Before each compute action the executor issues the exchanges due there (parallel/pipeline_exchange.h:
// for gpipe, 1f1b and zb1 the send listed since the previous compute action and the receive listed
// before this one; interleaved has no exchange between a backward and the forward after it, so the
// one before the backward carries the outputs since the previous exchange and the inputs of both, as
// two exchanges, one per direction), each one send_recv (grouped: its halves progress together),
// and orders each compute action after the exchange that carries its input; sends after
// the last compute action go at the end. Nothing is posted otherwise, so both sides issue their
// messages in list order, which is how NCCL matches them (it has no tags). check_exchanges proves at
// construction that the schedule cannot deadlock this way even though every send waits for its
// receive: every schedule of the grid passes, and one that did not would be refused there. On a
// device "ordered after" costs no host wait (CommHandle::wait orders the compute stream after the
// exchange's event).
//
// Data parallelism. Before each compute action the stages are told whether it is the last on this
// rank to touch its chunk's weight gradients (the chunk's last B), or the last F of the chunk (where
// the last stage's wte gradient is complete): the trainer turns that into DataParallel's
// set_last_micro, so a unit's reduction starts when its last micro-batch's backward is done and
// overlaps the rest of the pipeline's drain.
//
// zb1's split backward: B_input consumes the received gradient and produces the one sent back, as B
// does; W touches no message. "last" is given for a chunk's last B_input (the embedding's and final
// LayerNorm's gradients are complete then) and for its last W (the layers' are).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/op_timer.h"
#include "parallel/comm.h"
#include "parallel/pipeline_exchange.h"
#include "parallel/pipeline_schedule.h"
#include "runtime/arena.h"

namespace mt::parallel {

// What the executor drives: the stages a rank holds (its chunks), for the micro-batches of a step.
class PipelineStages {
 public:
  virtual ~PipelineStages() = default;
  // The elements of one message (activation or gradient), their type, and a buffer for one (in the
  // memory the communicator reads and writes; uninitialised).
  virtual size_t message_elems() const = 0;
  virtual DType message_dtype() const = 0;
  virtual Buffer alloc_message() = 0;
  // Called before every compute action: `last` is true for the chunk's last backward on this rank
  // (its weight gradients are then complete) and for the chunk's last forward.
  virtual void before(const Action& a, bool last) = 0;
  // F of `chunk` on `micro`: `input` the previous stage's activation (empty on stage 0); returns the
  // output for the next stage (empty on the last stage).
  virtual Buffer forward(int chunk, int micro, Buffer input) = 0;
  // B: `dy` the next stage's gradient (empty on the last stage); returns the gradient of F's input
  // (empty on stage 0).
  virtual Buffer backward(int chunk, int micro, Buffer dy) = 0;
  // zb1's halves of backward: B_input returns what backward returns, W adds the weight gradients.
  virtual Buffer backward_input(int chunk, int micro, Buffer dy) = 0;
  virtual void backward_weight(int chunk, int micro) = 0;
};

// One step of one rank, measured by the executor. Within run_s a rank not computing is blocked on
// receives, completing sends, or in the executor's own bookkeeping (run_s - compute_s); the trainer
// measures the bubble against the longest rank's run_s (train/pipeline.h).
//
// Where the times come from. By default the host's clock around each call, which is the compute's
// time on the CPU backend. On a device a call only queues kernels, so the trainer gives the executor
// device timers (set_timers: CUDA events on the compute stream): run_s is then the device's time from
// the step's first pipeline work to the last send's completion, and forward_s, backward_s the device's
// time for the kernels of each compute action; a rank's idle time (run_s - compute_s) is what its
// compute stream spent waiting for messages (an event after a stream wait fires once the wait is
// over) or for the host to queue work. They are read, with one device synchronisation, by stats(),
// after the step. recv_wait_s and send_wait_s stay host times (near zero on a device).
struct PipelineStats {
  double run_s = 0;        // the whole of run(): this rank's part of the step's forward and backward
  double recv_wait_s = 0;  // blocked waiting for a message before a compute action (the bubble, mostly)
  double send_wait_s = 0;  // completing sends at the end of the step
  double compute_s = 0;    // inside forward and backward (forward_s + backward_s)
  double forward_s = 0, backward_s = 0;  // backward_s: B, or B_input and W
  int forwards = 0, backwards = 0;  // compute actions run (F; B or B_input: one per micro-batch and chunk)
  int messages_sent = 0, messages_received = 0;
};

enum class Pairing : uint8_t { ahead, paired };
// The pairing a communicator needs: paired for a device communicator (NCCL), ahead for a host one.
Pairing pairing_for(const Comm& pp);

class PipelineExecutor {
 public:
  // `schedule` must pass validate_schedule; `pp` is the pipeline communicator (rank = pipeline rank).
  // Paired: throws (one line) unless check_exchanges accepts the schedule.
  PipelineExecutor(Schedule schedule, Comm& pp, Pairing pairing);

  // Runs this rank's actions of one step; every send and receive is complete when it returns (on a
  // device: the compute stream is ordered after them).
  void run(PipelineStages& stages);
  // The last step's figures (with device timers: read from them, waiting for the device once).
  const PipelineStats& stats();
  // Device timers (kernels/op_timer.h, on the compute stream): `span` brackets the whole of run(),
  // `compute` each compute action. Without them, the host clock (the CPU backend).
  void set_timers(std::unique_ptr<ops::OpTimer> span, std::unique_ptr<ops::OpTimer> compute);
  Pairing pairing() const { return pairing_; }
  // Each compute action becomes a span on the trace's lane "pipeline" (named F3, B3, Bi3, W3 for
  // micro-batch 3; with chunk c prefixed under interleaving: c1F3) while it records.
  void set_trace(Trace* trace);
  const Schedule& schedule() const { return schedule_; }

 private:
  using Key = std::tuple<ActionKind, int, int>;  // (message kind, chunk, micro)
  struct Message {  // the handle is declared last, so it is destroyed (waited for) before its buffers
    Buffer buf;
    Buffer sent;  // paired: the buffer sent in the same exchange, in flight until `handle` completes
    CommHandle handle;
  };
  void post_receives_through(size_t end, PipelineStages& stages);
  Buffer take_produced(const Action& send);
  void exchange_through(size_t before, PipelineStages& stages);
  void resolve_device_times();
  Buffer take_received(ActionKind kind, const Action& a);
  void reap_sends(bool wait);
  std::string action_name(const Action& a) const;

  Schedule schedule_;
  Comm& pp_;
  Pairing pairing_;
  std::vector<Exchange> exchanges_;  // paired: this rank's, in order
  size_t next_exchange_ = 0;
  const std::vector<Action>& actions() const { return schedule_.ranks[size_t(pp_.rank())]; }
  // Index of the last F, of the last B or B_input, and of the last W per chunk in this rank's list.
  std::vector<size_t> last_forward_, last_backward_, last_weight_;
  size_t posted_ = 0;  // receives before this index of the list have been posted
  std::map<Key, Message> received_;      // posted receives, by what they carry
  std::map<Key, Buffer> produced_;       // outputs of F (send_activation) and B (send_gradient), not yet sent
  std::vector<Message> sending_;         // sends in flight, with their buffers
  PipelineStats stats_;
  std::unique_ptr<ops::OpTimer> span_timer_, compute_timer_;
  bool device_times_pending_ = false;
  Trace* trace_ = nullptr;
  int trace_lane_ = 0;
};

}  // namespace mt::parallel
