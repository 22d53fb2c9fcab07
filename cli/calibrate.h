// `minitrain bench --calibrate [out=FILE] [threads=N]`: measures the machine it runs on and writes a
// hardware file for `minitrain plan hw=FILE` (plan/hardware.h). A chip is one rank: run it the way
// the training runs (same mpirun -np and OMP_NUM_THREADS) so that every rank measures while the
// others do, and the figures are each rank's share.
//   flops         the project's CPU GEMMs on a transformer layer's four products, forward and backward
//                 (CalibrationShape below; a square 1024^3 product, which runs faster, is kept under
//                 "samples");
//                 the CPU backend computes in fp32 for every storage type, so bf16 and fp16 get the
//                 same figure
//   memory        a copy of a buffer well beyond the caches (bytes read + written per second), the
//                 machine's physical memory divided by the ranks
//   links         under mpirun with more than one rank, ping-pong between ranks 0 and 1 by message
//                 size (8 B to 16 MiB): the latency is half the round trip of the smallest, the
//                 bandwidth the largest message over its one-way time; both are kept under "samples".
//                 One rank: the links are left at the built-in cpu entry's figures and say so. The
//                 ranks of one mpirun on one machine share memory, so "inter" repeats "intra".
//   ops           the attention kernels (materialized and flash), AdamW and the gradient norms' sum of
//                 squares, each in the units the planner counts them in (plan/hardware.h "ops").
// device=cuda measures the GPU each rank would train on with the same ops (bf16 GEMMs and attention,
// fp32 GEMMs, a device-to-device copy, NCCL ping-pong between ranks 0 and 1) at larger shapes; what
// one process cannot measure (the link between nodes, dp_overlap) keeps the built-in h100 entry's
// figures, and the file's source says so.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/comm.h"
#include "runtime/tensor.h"

namespace mt::cli {

// The measured hardware object (every rank takes part; rank 0's figures are the minima over ranks).
// The shapes the GEMMs and attention are measured at (rows=, seq_len=, n_embd=, n_head=): a
// transformer layer's four weighted products on `rows` rows of width n_embd, attention over seq_len
// tokens (rows / seq_len sequences). Defaults: GPT-2's width at 1024 rows and T 256 on a CPU, 16384
// rows and T 1024 on a GPU. Small products run below large ones, so a file calibrated at a run's own
// rows per rank and sequence length predicts that run best.
struct CalibrationShape {
  int rows = 1024, seq_len = 256, n_embd = 768, n_head = 12;
  static CalibrationShape defaults(Device device);
};

// device: the backend measured (cuda: the GPU chosen by the node-local rank, as the trainer does).
nlohmann::json calibrate_hardware(parallel::Comm& world, int threads, Device device, const CalibrationShape& shape,
                                  int local_rank = -1);
// Parses out=, threads=, device= and the shape, measures, and writes the file (rank 0) or prints it
// (no out=).
int calibrate_main(const std::vector<std::string>& args, parallel::Comm& world, int local_rank = -1);

}  // namespace mt::cli
