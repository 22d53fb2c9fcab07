// Process start and end: the World (MPI's lifetime as an object), the error policy of a distributed
// program, and the check that every rank runs the same configuration.
//
//   int main(int argc, char** argv) {
//     mt::parallel::World world(&argc, &argv);
//     return mt::parallel::run_main(world, [&](mt::parallel::World& w) { ...; return 0; });
//   }
//
// Threading: the trainer calls MPI from one thread at a time, always the main thread, so it needs
// MPI_THREAD_FUNNELED. World asks for MPI_THREAD_MULTIPLE so that a background thread (the async
// checkpoint writer, a data prefetcher) may drive a communicator of its own; code that does so must
// check thread_multiple(). World fails if the library offers less than FUNNELED.
//
// Communicators derived from the world (a Mesh, any split) must be destroyed before the World, as
// they are when they live inside the body passed to run_main.
//
// Without mpirun, an MPI build starts as a one-rank world (MPI singleton init); a build without MPI
// (MT_MPI=OFF) always is one, on SelfComm.
#pragma once
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "parallel/comm.h"

namespace mt::parallel {

class World {
 public:
  // Initialises MPI (when built with it). Only one World may exist in a process.
  World(int* argc, char*** argv);
  // Finalises MPI. MPI_Finalize waits for every rank: a rank still waiting after the world
  // communicator's wait deadline (dist.timeout) prints one "hung" line and exits with kExitHung.
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  // Rank among the processes on this node (from MPI_Comm_split_type SHARED): picks the GPU.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  Comm& comm() const { return *comm_; }
  bool thread_multiple() const { return thread_multiple_; }

  // Ends the whole job now with `code`: MPI_Abort in an MPI world (mpirun then kills every rank),
  // else std::_Exit. Output streams are flushed first.
  [[noreturn]] void abort(int code) const;

 private:
  std::unique_ptr<Comm> comm_;
  int local_rank_ = 0;
  int local_size_ = 1;
  bool thread_multiple_ = false;
  bool finalize_ = false;
};

// Runs body(world) and returns its exit code. If body throws on a rank, that rank prints one line
// "[rank R] error: <what>" to stderr and, in a world of more than one rank, aborts the job, so the
// other ranks (possibly blocked in a collective with the failed one) do not hang. A CollectiveError
// is printed once, by rank 0, without the rank prefix; the other ranks wait a few seconds for rank 0
// to end the job and only then print and abort themselves; a FollowOnError waits the same way for
// the rank that caused it. A PeerTimeoutError (a wait on peers passed its deadline) is printed by
// every rank that raises it, with its rank, and the job is aborted with kExitHung (4) after a grace
// period (the timeout, at most 5 s) that lets the other live ranks report their own.
// An AgreedError is printed by its reporter only, with the reporter's prefix; the others wait as for
// a CollectiveError. The exit status is 1, or the CollectiveError's own exit_status().
// The line comes first: a body whose objects wait in their destructors (a checkpoint writer on a slow
// disk) keeps them alive past a failure on several ranks (cli/main.cc keeps the Trainer), so that the
// job is reported and ended before any such wait, as a crash would end it (saves are crash-safe).
int run_main(World& world, const std::function<int(World&)>& body);

// Collective over `comm`: every rank calls it at the same point with the failure it met there (null:
// none). Returns when no rank failed; otherwise every rank throws the same AgreedError: the text of the
// lowest rank whose failure ranks first (its own error, then a wait on peers that timed out, then a
// FollowOnError, whose cause lies elsewhere), with the other ranks that failed on their own appended
// ("; also failed on rank 1"), and that failure's exit status (kExitHung for a PeerTimeoutError).
// Costs one all-reduce of comm.size() int32 when nothing failed, and two broadcasts when something did.
void raise_agreed_failure(Comm& comm, std::exception_ptr mine);

// Checks that `text` (e.g. the resolved config as JSON) is identical on every rank of `comm`. On a
// mismatch every rank throws CollectiveError; rank 0's message names the ranks that differ and,
// when the text is JSON, the first differing keys, e.g.
//   "the resolved config differs across ranks: rank 2 (and 1 other) disagree with rank 0;
//    /train/lr: 0.001 on rank 0, 0.002 on rank 2".
// `what` names the text in the message ("the resolved config").
void check_same_across_ranks(Comm& comm, const std::string& text, const std::string& what);

// The difference report above for two texts (exposed for tests): JSON-aware when both parse.
std::string describe_difference(const std::string& a, int rank_a, const std::string& b, int rank_b);

// FNV-1a 64-bit hash (Fowler, Noll, Vo): what ranks exchange instead of the full text.
uint64_t fnv1a64(const std::string& s);

}  // namespace mt::parallel
