// A job in which one rank fails while the others wait for it in a collective. Run as
//   mpirun -np N mpi_fault <mode>
// with mode: none (no failure, under a deadline of 1e12 s, which the MPI_Finalize watchdog must not
// take for an overflowed, already-passed one: exits 0), kill (rank 1 SIGKILLs itself), exit (rank 1 exits with
// status 3 without finalising MPI), throw (rank 1 throws), collective (every rank throws the same
// CollectiveError), mismatch (the last rank has a different config), hang (rank 1 stops itself with
// SIGSTOP; the others' waits have a 1 s deadline and the job must end with status 4, each live rank
// naming the op it waited in), agreed (every rank but 0 fails on its own and the ranks agree on one
// failure to report: rank 1's, naming rank 2 too, in one line), finalize (every collective
// succeeds, then rank 1 stops itself with SIGSTOP before returning: the others' MPI_Finalize waits
// for it, and with a 1 s deadline they must end the job with status 4). Every mode but `none` must
// end the whole job promptly with a non-zero status; expect_failure.sh checks that.
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "parallel/launch.h"

using namespace mt::parallel;

int main(int argc, char** argv) {
  World world(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "none";
  return run_main(world, [&](World& w) {
    Comm& c = w.comm();
    const int rank = c.rank();
    if (mode == "hang" || mode == "finalize") c.set_wait_policy({1.0, nullptr});
    if (mode == "none") c.set_wait_policy({1e12, nullptr});
    float x = 1.f;
    c.all_reduce(&x, 1, mt::DType::f32, ReduceOp::sum);  // step 0: every rank healthy
    if (rank == 1 && mode == "kill") std::raise(SIGKILL);
    if (rank == 1 && mode == "exit") std::_Exit(3);
    if (rank == 1 && mode == "hang") std::raise(SIGSTOP);
    if (rank == 1 && mode == "throw") mt::fail("injected failure at step %d", 1);
    if (mode == "collective") throw CollectiveError("injected collective failure");
    if (mode == "agreed") {
      std::exception_ptr mine;
      if (rank > 0) mine = std::make_exception_ptr(mt::Error("injected own failure on rank " + std::to_string(rank)));
      raise_agreed_failure(c, mine);
    }
    if (mode == "mismatch")
      check_same_across_ranks(c, rank == c.size() - 1 ? R"({"lr": 0.2})" : R"({"lr": 0.1})", "the resolved config");
    // The healthy ranks block here on a rank that never arrives, unless the job is ended for them.
    for (int step = 1; step <= 3; step++) c.all_reduce(&x, 1, mt::DType::f32, ReduceOp::sum);
    if (rank == 1 && mode == "finalize") std::raise(SIGSTOP);  // stuck after the last collective
    return x == float(c.size()) * float(c.size()) * float(c.size()) * float(c.size()) ? 0 : 2;
  });
}
