// Expert parallelism (--ep E'): the E experts of a mixture layer are split over the E' ranks of an ep
// group (parallel/mesh.h), rank j holding experts [j E/E', (j+1) E/E'). Each rank routes and plans its
// own tokens (moe/dispatch.h: capacity and drops are decided where the tokens are, so every layout
// drops the same ones); its permuted rows are then already in blocks by destination rank, and
//
//   counts     each rank first tells every other how many rows it sends to each of that rank's experts
//              (an all_to_all_v of E/E' i32 per rank pair);
//   dispatch   an all_to_all_v of the permuted rows to their experts' ranks, which re-order what they
//              receive (by source rank, then expert) into one block per local expert (by expert, then
//              source rank, each source's rows in their stable order) for the grouped GEMM;
//   return     the experts' outputs back the same way, counts swapped (the all_to_all_v's own twin).
//
// Backward runs the same two moves on the gradients: the rows' gradient out to the experts, the
// experts' input gradient back. Bytes per layer and direction: sum over destinations j != rank of the
// rows sent there, times C elements (the Comm counters count them as all_to_all).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "moe/dispatch.h"
#include "parallel/comm.h"
#include "runtime/memory.h"

namespace mt::moe {

struct ExpertExchange {
  int ranks = 1, rank = 0, local = 0;  // ep group size, this rank's index, experts per rank
  std::vector<size_t> send_rows;       // (ranks) rows this rank sends to each rank
  std::vector<size_t> recv_rows;       // (ranks) rows each rank sends to this one
  std::vector<int64_t> count;          // (ranks x local) rows from rank s for local expert e, at s local + e
  // The received rows as the experts read them: E = local, offset = each local expert's block. Only
  // offset (and E) is meaningful; tokens stay with their source rank.
  DispatchPlan experts;
  int64_t rows() const { return experts.rows(); }
};

// The counts exchange (collective over ep, a host communicator): p is this rank's plan over all E experts.
ExpertExchange exchange_counts(const DispatchPlan& p, parallel::Comm& ep);

// out (x.rows(), C) = the rows other ranks send for this rank's experts, expert by expert; rows
// (p.rows(), C) this rank's permuted rows. Collective over `data`, the ep group's communicator for
// tensors where the rows live (the ep group itself on the CPU, its NCCL twin on a GPU); `staging`
// (x.rows(), C) receives the rows source by source before `mem` moves them into expert order.
template <class S>
void to_experts(S* out, const S* rows, const ExpertExchange& x, int C, parallel::Comm& data, S* staging,
                const MemOps& mem);
// The inverse: rows (p.rows(), C) = what the experts made of this rank's rows, from expert_rows
// (x.rows(), C). Collective over `data`; staging as above.
template <class S>
void from_experts(S* rows, const S* expert_rows, const ExpertExchange& x, int C, parallel::Comm& data, S* staging,
                  const MemOps& mem);

}  // namespace mt::moe
