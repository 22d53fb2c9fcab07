// `minitrain bench`: times training steps of a named config on synthetic tokens and prints a table
// (tokens/s, ms/step, MFU and HFU against the calibrated or given peak, time split, memory).
#pragma once
#include <string>
#include <vector>

namespace mt::train {

// args: the same key=value / --flag options as `train`, plus warmup=<n> (untimed steps, default 2).
int bench_main(const std::vector<std::string>& args);

}  // namespace mt::train
