// Pipeline schedules as data: for p pipeline ranks, m micro-batches and v model chunks per rank, the
// ordered list of actions each rank runs in one optimizer step. An executor interprets the lists;
// parallel/pipeline_sim.h checks and times them without MPI.
//
// Who holds what. The model's layers are cut into S = p v stages; rank r holds the v stages
// s = chunk p + r (chunk 0..v-1; with v = 1 stage s is rank s). Stage 0 reads the tokens, stage S-1
// computes the loss. A stage keeps a micro-batch's activations from its forward until its backward
// has consumed them (docs/pipeline.md gives the memory model).
//
// Communication and its pairs. Each micro-batch crosses each stage boundary twice: its activation
// goes forward (send_activation -> recv_activation) and the gradient of that same activation comes
// back (send_gradient -> recv_gradient): the backward twin of "send activation to stage s+1" is
// "receive gradient from stage s+1". Both are B x T x C elements (a = B T C per message, in the
// compute dtype; B T C / tp per rank under sequence parallelism), so per step every boundary moves
// 2 m a elements and a rank sends m v a (activations, last stage excepted) + m v a (gradients, first
// stage excepted). Point to point only (parallel/comm.h send/recv): no collective spans the pipeline.
//
// Schedules (pp.schedule):
//   gpipe        every forward, then every backward (Huang et al. 2019, "GPipe"). Holds all m
//                micro-batches' activations. Bubble (p-1)/(m+p-1) of the step.
//   1f1b         PipeDream-flush (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
//                Training"): rank r runs min(p-r-1, m) warmup forwards, then alternates one forward
//                and one backward (steady), then the remaining backwards (cooldown). Same bubble as
//                GPipe, at most min(p-r, m) micro-batches in flight on rank r.
//   interleaved  v chunks per rank (Narayanan et al. 2021, "Efficient Large-Scale Language Model
//                Training on GPU Clusters", sec. 2.2): forwards in rounds of p micro-batches per chunk
//                (chunk 0 of micro-batches 0..p-1, chunk 1 of the same, ..., then the next p), the
//                backwards in the same rounds with the chunks reversed; warmup (p-r-1) 2 + (v-1) p
//                forwards. Bubble (p-1)/(v m) of the ideal time, at the price of v times more messages
//                and more activations in flight. Needs v >= 2 and m a multiple of p: with a short round
//                these warmup counts can deadlock (e.g. p=4, m=5, v=3), and where they do not, the
//                bubble we simulated was 0.29-1.14 of 1f1b's rather than 1/v (docs/pipeline.md).
//   zb1          ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): backward split into
//                B (input gradient, on the critical path between stages) and W (weight gradient,
//                local). 1f1b's order with B in place of the full backward, and rank r deferring its
//                W by r micro-batches, so that the Ws fill the cooldown bubble; the micro-batches in
//                flight (held until W) stay at most p, 1f1b's peak. Bubble (p-1)(T_F + T_B - T_W)
//                when T_W <= T_F, T_B and m >= p: a third of 1f1b's with equal costs.
// m < p is allowed for gpipe, 1f1b and zb1 (a valid schedule that is mostly bubble).
//
// What an executor may assume (every schedule built here passes validate_schedule; so must any other):
//   - A rank runs its list in order. Compute actions: F (forward of `chunk` on `micro`), B (full
//     backward: input and weight gradients), B_input and W (zb1's halves; B_input always before W).
//     Weight gradients accumulate (+=) over micro-batches.
//   - recv_* is listed before the compute action that consumes it, send_* after the one that
//     produces it (immediately before and after in the schedules built here). A receive may be
//     posted earlier (non-blocking, recv_async) provided the receives from one peer are posted in
//     list order; it must complete before its consumer starts. A send starts when listed (send_async) and is never waited for before later
//     actions (complete it at the step's end, or when its buffer is reused): the validator proves
//     deadlock freedom for eager sends and blocking receives, not for rendezvous sends.
//   - Messages from rank a to rank b (both directions, activations and gradients alike) match in
//     list order: the k-th send a -> b is the k-th receive on b from a. One tag suffices, and NCCL's
//     issue-order matching holds.
//   - Stage 0's forward reads the tokens (no receive); stage S-1's forward ends in the loss and its
//     backward starts from it (no gradient received). With p = 1 there is no communication at all:
//     consecutive chunks hand activations and gradients over in memory.
//   - The last action touching chunk c's weight gradients on a rank (its last B or W) is where data
//     parallelism may start reducing that chunk's gradients.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt::parallel {

enum class ScheduleKind : uint8_t { gpipe, one_f_one_b, interleaved, zb1 };
// "gpipe", "1f1b", "interleaved", "zb1"; throws one line naming pp.schedule for anything else.
ScheduleKind parse_schedule_kind(const std::string& name);
const char* schedule_kind_name(ScheduleKind k);

enum class ActionKind : uint8_t {
  forward,          // F
  backward,         // B: input and weight gradients together
  backward_input,   // B_input (zb1): the input gradient, sent on to the previous stage
  backward_weight,  // W (zb1): the weight gradient, after B_input
  recv_activation,  // the input of F, from the previous stage
  send_activation,  // the output of F, to the next stage
  recv_gradient,    // the gradient of F's output, from the next stage, for B / B_input
  send_gradient,    // the gradient of F's input, made by B / B_input, to the previous stage
};
const char* action_kind_name(ActionKind k);  // "F", "B", "B_input", "W", "recv_activation", ...
bool is_compute(ActionKind k);

struct Action {
  ActionKind kind = ActionKind::forward;
  int chunk = 0;  // this rank's model chunk (0..v-1): stage chunk * p + rank
  int micro = 0;  // micro-batch 0..m-1
  int peer = -1;  // send/recv: the pipeline rank on the other side; -1 for compute actions
  bool operator==(const Action&) const = default;
};

// The sizes of a schedule, as the options give them.
struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int p = 1;  // pipeline ranks (pp)
  int m = 1;  // micro-batches per step (grad_accum)
  int v = 1;  // model chunks per rank (pp.virtual)
};

// Throws one line naming the option (pp, grad_accum, pp.virtual, pp.schedule) unless the spec can
// be built: p, m, v >= 1; v >= 2 exactly for interleaved; interleaved needs m % p == 0; at most
// kMaxScheduleComputes forward passes (p m v) so that a plan stays small.
void check_schedule_spec(const ScheduleSpec& spec);
constexpr int64_t kMaxScheduleComputes = int64_t(1) << 18;

struct Schedule {
  ScheduleSpec spec;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions, in order

  int p() const { return spec.p; }
  int m() const { return spec.m; }
  int v() const { return spec.v; }
  int stages() const { return spec.p * spec.v; }
  int stage(int rank, int chunk) const { return chunk * spec.p + rank; }
  int rank_of_stage(int s) const { return s % spec.p; }
  int chunk_of_stage(int s) const { return s / spec.p; }
  // True when the backward is split into B_input and W (zb1).
  bool split_backward() const { return spec.kind == ScheduleKind::zb1; }
};

// "F(chunk 0, micro 3)", "recv_gradient(chunk 1, micro 0) from rank 2", for error messages.
std::string describe(const Action& a);

// The schedule `spec` names, with its communication (check_schedule_spec first).
Schedule build_schedule(const ScheduleSpec& spec);

// The compute-only order of each rank for `spec` (what build_schedule lowers).
std::vector<std::vector<Action>> compute_order(const ScheduleSpec& spec);

// Adds the sends and receives to compute-only lists: recv_activation before each F whose input comes
// from another rank, send_activation after each F whose output goes to one, recv_gradient before
// each B / B_input that needs the next stage's gradient, send_gradient after each B / B_input whose
// gradient the previous stage needs. Only stage boundaries between two ranks communicate.
Schedule lower_communication(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& compute);

}  // namespace mt::parallel
