// Preemption: what a batch system sends before it kills a job (Slurm and Kubernetes: SIGTERM, then
// SIGKILL after a grace period; Slurm's --signal: SIGUSR1 ahead of time) turned into a request the
// training loop honours at its next step boundary: the ranks agree on it, save the step they reached
// and exit with mt::kExitPreempted (runtime/exit_status.h).
//
// The handlers only record the signal in a lock-free atomic: the one piece of global mutable state
// the project allows, since a signal handler can reach nothing else. The first signal also restores
// the default action of both signals, so a second one ends the process at once, and arms a deadline
// (alarm(2): SIGALRM's default action ends the process) for a step boundary that never comes (a
// rank stuck in a collective, a step far longer than the grace period).
//
// Under mpirun (Open MPI 4): SIGUSR1 sent to mpirun is forwarded to every rank. SIGTERM sent to
// mpirun is passed on as SIGTERM and followed by SIGKILL after odls_base_sigkill_timeout seconds
// (default 1: too short for a save; give `--mca odls_base_sigkill_timeout 60`), and mpirun then
// exits 1 whatever the ranks did. SIGTERM sent to the ranks themselves (srun, scancel, a
// Kubernetes pod) is handled like SIGUSR1.
#pragma once

namespace mt {

// Installs the SIGTERM and SIGUSR1 handlers. `deadline_s` > 0: the first signal also schedules
// SIGALRM that many seconds later; 0: no deadline. May be called again (main installs them before
// MPI starts, then with the options' deadline): a request recorded in between is kept, and its
// deadline starts at the second call.
void install_preemption_handlers(int deadline_s);

// The signal that requested preemption (SIGTERM or SIGUSR1), or 0 when none arrived.
int preemption_signal();

// For tests: forgets a recorded request and puts the handlers back (as install_preemption_handlers).
void reset_preemption_for_tests(int deadline_s);

// A rank started by a launcher (mpirun) ends at once (SIGKILL) when its launcher dies, instead of
// training on without it as an orphan. A no-op for a process that no launcher started, or off Linux.
void stop_with_launcher();

}  // namespace mt
