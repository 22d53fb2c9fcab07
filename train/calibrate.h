// `minitrain bench --calibrate [out=FILE] [threads=N]`: measures the machine it runs on and writes a
// hardware file for `minitrain plan hw=FILE` (train/hardware.h). A chip is one rank: run it the way
// the training runs (same mpirun -np and OMP_NUM_THREADS) so that every rank measures while the
// others do, and the figures are each rank's share.
//   flops         the project's CPU GEMM on a training-shaped layer, forward and backward (1024 rows,
//                 768 -> 3072; a square 1024^3 product, which runs faster, is kept under "samples");
//                 the CPU backend computes in fp32 for every storage type, so bf16 and fp16 get the
//                 same figure
//   memory        a copy of a buffer well beyond the caches (bytes read + written per second), the
//                 machine's physical memory divided by the ranks
//   links         under mpirun with more than one rank, ping-pong between ranks 0 and 1 by message
//                 size (8 B to 16 MiB): the latency is half the round trip of the smallest, the
//                 bandwidth the largest message over its one-way time; both are kept under "samples".
//                 One rank: the links are left at the built-in cpu entry's figures and say so. The
//                 ranks of one mpirun on one machine share memory, so "inter" repeats "intra".
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/comm.h"

namespace mt::train {

// The measured hardware object (every rank takes part; rank 0's figures are the minima over ranks).
nlohmann::json calibrate_hardware(parallel::Comm& world, int threads);
// Parses out= and threads=, measures, and writes the file (rank 0) or prints it (no out=).
int calibrate_main(const std::vector<std::string>& args, parallel::Comm& world);

}  // namespace mt::train
