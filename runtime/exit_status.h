// The exit statuses of `minitrain train`: what a supervisor (scripts/supervise, Slurm's requeue, a
// Kubernetes restart policy) needs to tell apart. README.md's "Exit statuses" documents the same list.
//
//   0  done: every step ran.
//   1  failed during the run (an I/O error, a peer that died, a crash as mpirun reports it):
//      resuming from the newest checkpoint may get past it, so it is relaunched.
//   2  refused before the first step: bad options, the run lock held by another run, a planned peak
//      over the memory available, a missing file. Relaunching cannot fix it: never relaunched.
//   3  diverged: a non-finite loss or gradient norm. Resuming would diverge again: never relaunched.
//   4  hung: a wait on peers passed dist.timeout. Relaunched.
//   5  preempted: SIGTERM or SIGUSR1 arrived, the ranks saved the step they had reached and stopped.
//      Relaunched (the resumed run loses no step).
#pragma once

namespace mt {

constexpr int kExitFailed = 1;
constexpr int kExitRefused = 2;
constexpr int kExitDiverged = 3;
constexpr int kExitHung = 4;
constexpr int kExitPreempted = 5;

}  // namespace mt
