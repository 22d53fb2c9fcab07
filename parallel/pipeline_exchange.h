// Paired exchanges: how the pipeline executor runs a schedule over a communicator whose sends wait
// for their receives (NCCL), and the check that doing so cannot deadlock.
//
// Why. The schedule validator (parallel/pipeline_sim.h) proves a schedule deadlock-free for eager
// sends and blocking receives, which is what MPI's buffered non-blocking sends give. NCCL's are not
// eager: a send completes only once the peer's matching receive runs, and every operation of a
// communicator runs in issue order on its one stream, so a receive posted early blocks the sends
// queued behind it. There the executor issues no receive ahead. Instead, at each compute action it
// issues one exchange: the sends listed since the previous compute action (its output) and the
// receives listed before this one (its input), grouped into a single send_recv (ncclGroupStart/End),
// whose two halves progress together; the compute action is ordered after the exchange. Megatron-LM
// pairs its 1F1B messages the same way (send_forward_recv_backward).
//
// The model checked here: each rank runs its exchanges in order, one at a time (compute in between
// takes no part: it only delays); a message completes once the sender and the receiver are both in
// the exchanges holding its two ends (the k-th send from a to b matches the k-th receive on b from a);
// an exchange is done once all its messages are. If no rank can finish its exchange, the schedule
// deadlocks under rendezvous sends, and check_exchanges says where, naming each waiting rank.
// gpipe, 1f1b and zb1 pass for every (p, m) of the schedule grid (tests/test_parallel_pipeline_exchange.cpp);
// a schedule in which two ranks each send before they receive does not, and neither do many
// interleaved ones (the smallest: p = 2, m = 4, v = 2, whose rounds have both ranks send a gradient
// first), which the trainer therefore refuses on GPUs (train/pipeline.cpp check_pipeline_options).
#pragma once
#include <cstddef>
#include <vector>

#include "parallel/pipeline_schedule.h"

namespace mt::parallel {

// One exchange of a rank: the sends and receives listed between two compute actions, issued together
// before compute action `before` (an index into the rank's list; the list's size for the sends after
// the last compute action). At most one send and one receive (a compute action produces one message
// and consumes one); `send` and `recv` index the rank's list, -1 when absent.
struct Exchange {
  size_t before = 0;
  long send = -1;
  long recv = -1;
};

// The exchanges of one rank's list, in order; empty ones (nothing between two compute actions) are
// left out. Throws naming the rank and the action when two sends or two receives fall between the
// same pair of compute actions.
std::vector<Exchange> paired_exchanges(const std::vector<Action>& list, int rank);

// Throws one line per cause unless every rank's paired exchanges run to the end under the model above:
// "pipeline schedule under rendezvous sends: deadlock; rank 0 waits in exchange 3 (send_activation
// (chunk 0, micro 1) to rank 1 ...), ...". `s` must pass validate_schedule first (messages matched).
void check_exchanges(const Schedule& s);

}  // namespace mt::parallel
