// `minitrain bench`: times training steps of a named config on synthetic tokens and prints a table
// (tokens/s, ms/step, MFU and HFU against the calibrated or given peak, time split, memory).
#pragma once
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace mt::cli {

// args: the same key=value / --flag options as `train`, plus warmup=<n> (untimed steps, default 2).
// Under mpirun (world size > 1) it also measures how much gradient communication is exposed after
// backward, next to the time the same reduction takes when nothing overlaps it. Rank 0 prints.
constexpr int kBenchWarmup = 2;  // untimed steps unless warmup= is given
constexpr int kBenchSteps = 5;   // timed steps unless steps= is given
constexpr double kFirstPeakSeconds = 1.0;  // the CPU peak reading before the steps (each after one: train::kPeakSeconds)
int bench_main(const std::vector<std::string>& args, parallel::Comm* world = nullptr, int local_rank = -1);

}  // namespace mt::cli
