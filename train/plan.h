// `minitrain plan`: sizing arithmetic before a run. So far the pipeline part: the schedule a layout
// would run, as a time x rank grid, with its simulated bubble next to the papers' formula and the
// activations each rank holds at its peak (parallel/pipeline_schedule.h, parallel/pipeline_sim.h).
//
//   minitrain plan pp=4 grad_accum=8 pp.schedule=1f1b [pp.virtual=V]
//
// Costs are one unit per micro-batch for each of F, B (input gradient) and W (weight gradient) of a
// rank's whole model share, so a whole backward takes two units and a chunk's pass 1/v.
#pragma once
#include <string>
#include <vector>

namespace mt::train {

// The report for `args` (key=value or --key value; keys pp, grad_accum, pp.schedule, pp.virtual).
// Throws one line naming the option on bad input.
std::string plan_report(const std::vector<std::string>& args);

// Prints plan_report(args) to stdout; returns the exit status.
int plan_main(const std::vector<std::string>& args);

}  // namespace mt::train
