// Paired exchanges: how the pipeline executor runs a schedule over a communicator whose sends wait
// for their receives (NCCL), and the check that doing so cannot deadlock.
//
// Why. The schedule validator (parallel/pipeline_sim.h) proves a schedule deadlock-free for eager
// sends and blocking receives, which is what MPI's buffered non-blocking sends give. NCCL's are not
// eager: a send completes only once the peer's matching receive runs, and every operation of a
// communicator runs in issue order on its one stream, so a receive posted early blocks the sends
// queued behind it. There the executor posts nothing on its own: it issues exchanges, each one
// send_recv (ncclGroupStart/End: its send and its receive progress together), at exchange points,
// and orders each compute action after the exchange that carries its input.
//
// The rule. An exchange point precedes a compute action. Each receive goes to the last point at or
// before the action that consumes it, each send to the first point after the action that produces it
// (the list's end after the last compute action). gpipe, 1f1b and zb1 have a point before every
// compute action, so each point holds at most the send listed since the previous compute action (its
// output) and the receive listed before this one (its input), issued as one exchange: Megatron-LM
// pairs its 1F1B messages the same way (send_forward_recv_backward). That pairing deadlocks many
// interleaved schedules (138 of the grid's 255; the smallest p = 2, m = 4, v = 2): their rounds have
// two ranks each send a gradient that the other receives only after an exchange of its own that waits
// on the first. So interleaved schedules have no point between a backward and the forward right
// after it: the point before the backward then holds up to two sends (the previous backward's
// gradient, the forward's activation) and two receives (this backward's gradient, the next forward's
// activation), the four messages Megatron-LM's interleaved schedule batches in one call
// (send_forward_backward_recv_forward_backward). They go as two exchanges, one per direction: the
// gradients (sent to the previous stage, received from the next) first, then the activations. The
// compute order is the schedule's; only when messages move changes.
//
// The proof. check_exchanges runs every rank's exchanges under this model: each rank runs its
// exchanges in order, one at a time (compute in between takes no part: its input arrived in an
// earlier exchange, so it only delays); a message completes once the sender and the receiver are both
// in the exchanges holding its two ends (the k-th send from a to b matches the k-th receive on b from
// a); an exchange is done once both its messages are. That is the executor on NCCL, where each
// exchange is one group on the communicator's stream, and the simulated NCCL's behaviour exactly
// (sim/: synchronous sends, a group's messages progressed together, each call run at issue). If no
// rank can finish its exchange, the schedule deadlocks, and check_exchanges says where, naming each
// waiting rank. Every schedule of the grid (gpipe, 1f1b, zb1 and interleaved with v 2-4; p 1-8,
// m 1-32) finishes (tests/test_parallel_pipeline_exchange.cpp); the executor runs the check at
// construction, so a future schedule that does not is an error there, in one line.
#pragma once
#include <cstddef>
#include <vector>

#include "parallel/pipeline_schedule.h"

namespace mt::parallel {

// One exchange of a rank, issued before compute action `before` (an index into the rank's list; the
// list's size for the sends after the last compute action): at most one send and one receive, whose
// indices into the list are `send` and `recv` (-1 when absent).
struct Exchange {
  size_t before = 0;
  long send = -1;
  long recv = -1;
};

// The exchanges of rank `rank` of `s` under the rule above, in issue order. Throws naming the rank and
// the action when a point holds two sends or two receives it cannot split (two in one direction, or
// any two where points are not merged).
std::vector<Exchange> paired_exchanges(const Schedule& s, int rank);

// Throws one line per cause unless every rank's paired exchanges run to the end under the model above:
// "pipeline schedule interleaved (p=2, m=4, v=2) under rendezvous sends: deadlock; rank 0 waits in
// exchange 3 on send_activation(chunk 0, micro 1) to rank 1, ...". `s` must pass validate_schedule first
// (messages matched).
void check_exchanges(const Schedule& s);

}  // namespace mt::parallel
