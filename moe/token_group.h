// The token group: the ranks whose rows make up one micro-batch, and where each of their rows sits in
// it. Under context parallelism each cp rank holds the zigzag chunks of every sequence
// (parallel/ring_attention.h: rank r holds chunks r and 2cp-1-r, in that order); under sequence
// parallelism each tp rank holds a contiguous 1/tp of its cp rank's rows. A mixture layer makes two
// decisions over the whole micro-batch, as the single-rank run of the same micro-batch does:
//
//   balance   A = E sum_i f_i P_i (moe/router.h) takes f and P over every token of the micro-batch:
//             each rank's loads and probability sums gathered bit for bit (tp inside cp) and added
//             in that rank order, so every rank of the group holds the same A;
//   capacity  an expert keeps the first ceil(factor N K / E) of its assignments in the micro-batch's
//             token order (N: the micro-batch's tokens, moe/dispatch.h's rule on one rank). Each rank
//             gathers every rank's expert choices (N K i32 in all), lays them out in token order
//             (micro-batch index b T + global position), plans the whole micro-batch, and keeps its
//             own assignments that the whole plan kept: the same assignments the single rank keeps.
//             Its own rows are then laid out as a one-rank plan lays them out (within an expert, in
//             increasing local assignment), the drops taken from the whole plan.
//
// Why gather the choices and not per-expert counts: a rank's rows are not one run of the token order
// (two chunks per sequence, cut again by tp), and the choices are K i32 a token, against the C
// elements of each of its rows that expert parallelism moves; the whole plan is then the one-rank
// rule itself, applied to the same array. Collectives: all_gather over tp (under sp) then over cp, the
// same on every rank of the group; none when the group is one rank.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/dispatch.h"
#include "parallel/comm.h"

namespace mt::moe {

struct TokenGroup {
  parallel::Comm* tp = nullptr;  // sequence parallelism: the tp ranks, each holding 1/tp of the rows
  parallel::Comm* cp = nullptr;  // context parallelism: the cp ranks, each holding zigzag chunks
  int B = 0, T = 0;              // the micro-batch: B sequences of T tokens (the whole sequence)
  int tp_size() const { return tp ? tp->size() : 1; }
  int cp_size() const { return cp ? cp->size() : 1; }
  int size() const { return tp_size() * cp_size(); }
  // The micro-batch index (b T + position) of each of the N rows held by the rank at (tp_rank,
  // cp_rank) of the group.
  std::vector<int64_t> token_index(int tp_rank, int cp_rank, int N) const;
  // Element-wise sums of `mine` over the group, the same bits on every rank (gathered, then added in
  // rank order: tp inside cp). Collective over the group.
  std::vector<double> sum(const std::vector<double>& mine) const;
};

// The plan of this rank's N tokens (their choices `expert` (N K)) under the capacity the whole
// micro-batch has, dropping exactly the assignments the single-rank plan of the micro-batch drops.
// Collective over the group. factor 0 (dropless) needs no group: plan_dispatch with capacity -1.
DispatchPlan plan_over_group(const TokenGroup& g, const int32_t* expert, int N, int K, int E, double factor);

}  // namespace mt::moe
