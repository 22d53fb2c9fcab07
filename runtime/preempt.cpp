#include "runtime/preempt.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace mt {

namespace {

// The documented exception to "no global mutable state": a signal handler can only reach a global,
// and it must be lock-free to be touched from one.
std::atomic<int> g_signal{0};
std::atomic<int> g_deadline_s{0};
static_assert(std::atomic<int>::is_always_lock_free, "the preemption flag must be lock-free");

void on_preempt(int sig) {
  int none = 0;
  if (!g_signal.compare_exchange_strong(none, sig)) return;
  // A second signal (either one) takes the default action: the process ends at once.
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGUSR1, SIG_DFL);
  const int deadline = g_deadline_s.load();
  if (deadline > 0) alarm(unsigned(deadline));
}

void install(int deadline_s) {
  g_deadline_s.store(deadline_s > 0 ? deadline_s : 0);
  struct sigaction sa {};
  sa.sa_handler = on_preempt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls the signal interrupts go on; the loop looks at the flag
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  if (g_signal.load() != 0) {
    // Asked for before this install (during start-up, under the early one): as after any first
    // signal, a second one ends the process at once, and the deadline runs from now.
    std::signal(SIGTERM, SIG_DFL);
    std::signal(SIGUSR1, SIG_DFL);
    if (deadline_s > 0) alarm(unsigned(deadline_s));
  }
}

}  // namespace

void install_preemption_handlers(int deadline_s) { install(deadline_s); }

int preemption_signal() { return g_signal.load(); }

void reset_preemption_for_tests(int deadline_s) {
  alarm(0);
  g_signal.store(0);
  install(deadline_s);
}

void stop_with_launcher() {
#ifdef __linux__
  // Open MPI, MPICH/Hydra and Slurm's PMI set these in the processes they start.
  if (!std::getenv("OMPI_COMM_WORLD_RANK") && !std::getenv("PMI_RANK") && !std::getenv("PMIX_RANK")) return;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The launcher may have died before the request: the process was then handed to init already.
  if (getppid() == 1) std::_Exit(1);
#endif
}

}  // namespace mt
