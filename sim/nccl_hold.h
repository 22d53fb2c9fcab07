// For tests: a collective whose peers never arrive, as a GPU sees it (sim/nccl.cpp defines it).
//
// On a GPU an NCCL call returns at issue; its kernel then waits on the device for the peers, and so
// does all work ordered after it, on its stream and on the streams that wait for its events. A host
// wait behind it (a synchronise, a copy to the host) blocks forever unless it polls under a deadline.
// The stand-in otherwise runs every call at issue (sim/nccl.cpp); a held launch instead communicates
// nothing and queues held work on its stream (sim.h enqueue_held) that completes only when one of the
// launch's communicators is aborted (ncclCommAbort, as NCCL's abort ends the waiting kernels). A
// launch is an ungrouped call or an outermost group. To hold the same collective on every rank, each
// rank holds the same launch number.
#pragma once
#include <cstdint>

namespace mt::sim::nccl {

// Launches this process has run so far (its next launch is number launches() + 1).
uint64_t launches();
// Holds the launch numbered `number` (0: none). A later call replaces the request.
void hold_launch(uint64_t number);

}  // namespace mt::sim::nccl
