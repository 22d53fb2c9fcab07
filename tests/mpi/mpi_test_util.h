// Shared by the MPI test programs: every rank runs the same GoogleTest cases inside one World.
// Only rank 0 prints the usual progress; other ranks print their failures, prefixed with the rank.
// Collectives inside a test must be reached by every rank, so tests use EXPECT_* (not ASSERT_*)
// after the first collective, and ctest's TIMEOUT catches a hang.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "parallel/launch.h"

namespace mt::testing {

// The World of this process (created by the shared main before any test runs).
parallel::World& mpi_world();

// The test seed, the same on every rank (rank 0 draws it and broadcasts it).
uint64_t shared_seed();

// True when `bytes` at p are identical on every rank of `comm` (compares FNV-1a hashes).
bool same_on_all_ranks(parallel::Comm& comm, const void* p, size_t bytes);

}  // namespace mt::testing
