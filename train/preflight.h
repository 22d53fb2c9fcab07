// Checks made before a run allocates or writes anything, so that a run that cannot work is refused
// (exit status mt::kExitRefused) in a second, with one line, and leaves no files behind.
#pragma once
#include <cstdint>
#include <string>

#include "config/options.h"
#include "parallel/comm.h"

namespace mt::train {

// The memory one rank of the run can have: on the CPU backend the host's MemAvailable shared by the
// `ranks_here` ranks of this node; with --device cuda (CUDA builds) the free memory of this rank's
// GPU. `what` says where the figure comes from, for the message. 0 when it cannot be told.
struct AvailableMemory {
  uint64_t bytes = 0;
  std::string what;
};
AvailableMemory available_memory(const config::TrainOptions& o, int local_rank, int ranks_here);

// The planner's peak per rank (plan/memory.h, the worst pipeline rank) on `world_size` ranks; 0 when
// the planner does not model the layout.
uint64_t planned_peak(const config::TrainOptions& o, int world_size);

// The refusal line when `peak` exceeds `available` ("" when it fits or either is unknown).
std::string memory_refusal(uint64_t peak, const AvailableMemory& available);

// Collective over `world`: unless mem.check=off, refuses the run (CollectiveError with
// kExitRefused, every rank together, rank 0's line naming both figures) when its planned peak per
// rank exceeds the memory any rank can have.
void check_memory_fits(const config::TrainOptions& o, parallel::Comm& world, int local_rank, int ranks_here);

}  // namespace mt::train
