// Dispatch and combine: the N K assignments of a routing (token t's j-th choice is assignment
// a = t K + j) laid out expert by expert, so that each expert's tokens are one contiguous block of
// rows its GEMMs read (a grouped GEMM), and the experts' outputs brought back to their tokens.
//
//   order     within an expert, assignments in increasing a (token order, then choice): stable, so
//             a plan is a pure function of the routing;
//   capacity  an expert keeps at most `capacity` rows, the first in that order; a dropped assignment
//             contributes zero to its token's output (the residual stream passes it unchanged),
//             and is counted; capacity < 0: dropless;
//   combine   y_t = sum over t's kept assignments a of gate_a * expert_out[row(a)], summed in fp32 and
//             rounded once; its backward gives each row gate_a dy_t and each gate <dy_t, out[row(a)]>.
//
// Pairs: permute <-> permute_backward (a gather of rows <-> the sum of the copies back into their
// tokens); combine <-> combine_backward. On one rank nothing crosses a wire; with expert parallelism
// the permuted rows would travel by all_to_all_v (parallel/comm.h) in both directions: M C elements
// out and back per layer, M the kept assignments.
//
// The arithmetic is the ops' CPU twin (kernels/cpu/moe.cpp); the model calls the ops themselves
// (kernels/ops.h `moe_*`), which run on either backend.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mt::moe {

struct DispatchPlan {
  int N = 0, K = 0, E = 0;
  int64_t capacity = -1;              // rows an expert keeps (-1: no limit)
  std::vector<int64_t> offset;        // (E + 1) first row of each expert's block; offset[E] = M rows
  std::vector<int32_t> row_of;        // (N K) the row of assignment a, -1 when dropped
  std::vector<int32_t> assignment_of; // (M) the assignment held in each row
  int64_t dropped = 0;                // assignments over capacity
  int64_t rows() const { return offset.empty() ? 0 : offset.back(); }
  int64_t rows_of(int e) const { return offset[size_t(e) + 1] - offset[size_t(e)]; }
  int token_of(int64_t row) const { return assignment_of[size_t(row)] / K; }
};

// The capacity of one expert for N tokens: ceil(factor N K / E); factor 0 means dropless (-1).
int64_t expert_capacity(double factor, int N, int K, int E);

// expert (N K): each assignment's expert.
DispatchPlan plan_dispatch(const int32_t* expert, int N, int K, int E, int64_t capacity);
// The same layout (within an expert, increasing a) with the drops decided elsewhere: assignment a is
// kept where keep[a] != 0 (moe/token_group.h: a micro-batch spread over ranks). `capacity` is recorded.
DispatchPlan plan_kept(const int32_t* expert, const uint8_t* keep, int N, int K, int E, int64_t capacity);

// out (M, C): row r = x[token_of(r)] (x (N, C)).
template <class S>
void permute(S* out, const S* x, const DispatchPlan& p, int C);
// out (N K, C): row a = rows[row_of(a)], zero where a was dropped. The inverse of permute: with K = 1
// and nothing dropped it restores x exactly.
template <class S>
void unpermute(S* out, const S* rows, const DispatchPlan& p, int C);
// dx (N, C) assigned: dx_t = sum of drows over t's kept rows, plus extra_t (fp32, nullptr: none),
// summed in fp32, rounded once.
template <class S>
void permute_backward(S* dx, const S* drows, const float* extra, const DispatchPlan& p, int C);

// y (N, C) assigned: y_t = base_t + sum_a gate_a rows[row_of(a)] over t's kept assignments, in fp32,
// rounded once. base (N, C) may be nullptr (zero) and may alias y.
template <class S>
void combine(S* y, const S* rows, const float* gate, const S* base, const DispatchPlan& p, int C);
// drows (M, C) assigned: gate_a dy_t; dgate (N K) assigned: <dy_t, rows[row_of(a)]> (0 if dropped).
template <class S>
void combine_backward(S* drows, float* dgate, const S* dy, const S* rows, const float* gate, const DispatchPlan& p,
                      int C);

}  // namespace mt::moe
