// The pipeline simulator and validator: a pure function of a Schedule (parallel/pipeline_schedule.h)
// and per-action costs, no MPI. It proves a schedule safe to execute and says how long it takes.
//
// Checks, each failing with one line that names the rank, the action's index in the rank's list and
// the action (e.g. "pipeline schedule: rank 1, action 4, F(chunk 0, micro 2): ..."):
//   - every action in range (chunk < v, micro < m), a send/recv's peer the rank of the neighbouring
//     stage, no communication between stages on the same rank (p = 1);
//   - every stage runs F of every micro-batch exactly once, and B exactly once, or (zb1) B_input and
//     W exactly once each;
//   - on a rank, a compute action comes after what it needs from that rank: B / B_input after its F,
//     W after its B_input, F after the previous stage's F when that stage is on the same rank (and
//     B after the next stage's B), a receive before its consumer and a send after its producer;
//   - every send has its receive and every receive its send, and the messages from rank a to rank b
//     match in list order (the k-th send is the k-th receive);
//   - no deadlock: the ranks are run with eager sends and blocking receives; when no rank can move,
//     the error names every waiting rank and what it waits for.
//
// Time model. Costs are per micro-batch for a rank's whole share of the model; a chunk costs 1/v of
// it. F costs `forward`, B_input `backward_input`, W `backward_weight`, a full B the sum of the two.
// A send costs the sender nothing; its message arrives `p2p_latency` later; a receive waits until
// then. Compute actions on a rank run back to back when their inputs are there.
//
// Memory model. A (chunk, micro-batch) pair holds its activations on its rank from the start of its
// F until the end of its B, or of its W under zb1: W needs the inputs of the weight GEMMs, saved by
// F, and the output gradients B_input made, which together are about a forward's activations, so
// counting the whole pair until W is the conservative choice (docs/pipeline.md). Peaks are counted in
// pairs, and in micro-batches of the rank's whole model share (pairs / v).
#pragma once
#include <string>
#include <vector>

#include "parallel/pipeline_schedule.h"

namespace mt::parallel {

struct PipelineCosts {
  double forward = 1;          // T_F
  double backward_input = 1;   // T_B (input gradient)
  double backward_weight = 1;  // T_W (weight gradient); a full backward costs T_B + T_W
  double p2p_latency = 0;      // from a send to its message's arrival
};

struct ActionTime {
  double start = 0, end = 0;  // compute: running; receive: from reaching it to its message; send: end = start
};

struct Simulation {
  int p = 0, m = 0, v = 0;
  std::vector<std::vector<ActionTime>> times;  // times[r][k]: action k of rank r
  std::vector<double> busy;                    // compute time of each rank
  std::vector<int> peak_pairs;                 // most (chunk, micro) pairs holding activations at once
  double makespan = 0;                         // the step: until the last action ends

  double ideal() const;              // the most compute time of any rank: the step without a bubble
  double bubble_time() const { return makespan - ideal(); }
  double bubble_fraction() const;    // idle rank-time over p x makespan: the step's share lost
  double bubble_over_ideal() const;  // bubble_time / ideal
  double peak_activations(int rank) const { return double(peak_pairs[size_t(rank)]) / v; }  // micro-batches
};

// Checks `s` (above) and runs it under `costs`; throws mt::Error naming the rank and action.
Simulation simulate(const Schedule& s, const PipelineCosts& costs = PipelineCosts());
inline void validate_schedule(const Schedule& s) { simulate(s); }

// The textbook bubble time (makespan - ideal) of `spec` under `costs` without latency:
//   gpipe, 1f1b   (p-1)(T_F + T_B + T_W)         (Huang et al. 2019; Narayanan et al. 2021)
//   interleaved   (p-1)(T_F + T_B + T_W) / v     (Narayanan et al. 2021, sec. 2.2.1)
//   zb1           (p-1)(T_F + T_B - T_W)         (Qi et al. 2023, sec. 3), for m >= p and
//                                                T_W <= min(T_F, T_B); NaN outside that
// The ideal time is m (T_F + T_B + T_W).
double formula_bubble_time(const ScheduleSpec& spec, const PipelineCosts& costs);

// The schedule as a text grid, one row per time slot of `slot` time units and one column per rank,
// each cell the compute action running then ("F3", "B1", "W0"; chunk first when v > 1: "1F3";
// "." idle). Every action's start and end must be multiples of `slot`.
std::string render_grid(const Schedule& s, const Simulation& sim, double slot);

}  // namespace mt::parallel
