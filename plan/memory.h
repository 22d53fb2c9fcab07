// The planner's memory model: the bytes one rank holds at the peak of a training step, per arena
// category (runtime/arena.h: the names of metrics.jsonl's `memory` object), derived from the same
// rules the code allocates by:
//
//   params      the fp32 master (whole, or its 1/D shard from ZeRO-1 on) and the compute copy (the
//               master itself in fp32; a 16-bit copy in bf16/fp16; under ZeRO-3 a 16-bit shard plus
//               the units gathered at a time: the one in use and the prefetched one)
//   grads       fp32, whole (ZeRO 0-1) or a shard plus the unit buffers alive at a time (ZeRO 2-3:
//               the unit being filled, the tied embedding through backward, up to three reductions
//               in flight before the oldest is waited for)
//   optimizer   AdamW's m and v over this rank's shard, and the step's scalars
//   activations what a micro-batch keeps for backward under the recompute mode (residual stream,
//               LayerNorm outputs and statistics, qkv, attention state, MLP hidden), 1/tp of it under
//               tensor parallelism and the residual stream 1/tp again under sequence parallelism,
//               times the micro-batches a pipeline rank holds at its peak (the schedule simulator;
//               under zb1 a micro-batch between its B_input and its W holds what W reads instead),
//               plus the largest pass's workspace (backward buffers, classifier logits chunk, ring
//               attention's blocks)
//   comm        reduce-scatter chunks of ZeRO 2-3 in flight and the norm's scalar; the MPI
//               communicators' reusable staging buffers are not modelled (they depend on which
//               host collectives ran: a few MiB at most for these models)
//
//   nccl        (not an arena category) device runs only: the buffers NCCL allocates for its
//               connections, outside the memory pool and the arena; an estimate (plan_nccl_bytes)
//
// Mixture-of-experts layers count their parameters (router, experts, shared experts) exactly, under
// expert parallelism E/ep routed experts per rank in a store of their own sharded over the
// expert-data group (dp x cp / ep ranks). Their activations are the routing's and the experts'
// buffers (model/gpt_moe.cpp) on the rows a rank holds: exact when dropless on one rank; under a
// capacity the experts are taken full, and under expert parallelism a rank's experts receive as many
// rows as it sends (the routing decides both).
//
// plan_units and plan_unit_gathers describe the model's store only, plan_expert_units and
// plan_expert_unit_gathers the experts' (the expert-data group's traffic).
//
// Units and their padding follow runtime/param_store.h (entries 16-element aligned, units a multiple
// of 16 x D, D = dp x cp) and the model's registration (model/gpt.cpp), so the model-state figures
// are exact; activations are a model of the allocations in model/gpt_stage.cpp and gpt_forward.cpp.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "config/options.h"
#include "parallel/mesh.h"
#include "runtime/arena.h"

namespace mt::plan {

// The padded flat sizes (elements) of the units pipeline rank `pp_rank` registers, in store order.
std::vector<int64_t> plan_units(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank);

// ZeRO-3: how many times each of those units is all-gathered in a step (before each use, and
// prefetched); zeros for other stages.
std::vector<int> plan_unit_gathers(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank);
// The same two for the store of the routed experts held apart under expert parallelism (empty
// without): one unit per mixture layer of the stage, sharded over the expert-data group.
std::vector<int64_t> plan_expert_units(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank);
std::vector<int> plan_expert_unit_gathers(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank);
// Whether data parallelism takes the embeddings' sparse gradient as rows (ZeRO 0-2, CPU, several
// replicas, no tp or pp).
bool plan_embedding_rows(const config::TrainOptions& o, const parallel::MeshLayout& l);

struct MemoryPlan {
  std::array<uint64_t, kNumMemCategories> bytes{};  // per-step peak of each category
  uint64_t nccl = 0;                                // NCCL's connection buffers (plan_nccl_bytes)
  uint64_t total() const;  // their sum and nccl's (the categories peak at different times)
  int pp_rank = 0;             // which pipeline rank these figures are for
  double in_flight = 1;        // micro-batches of activations held at the peak (pipeline schedules)
  uint64_t stash_per_micro = 0;  // activations one micro-batch keeps for backward
  uint64_t workspace = 0;        // the largest pass's transient activations
  uint64_t split_stash = 0;      // zb1: what a micro-batch holds between its B_input and its W
  // ZeRO 2-3: `bytes` assumes each reduction completes while the next unit's backward runs; the grads
  // figure when each completes at once (least) and when they complete only as the bound of two in
  // flight forces (bound, slow links). Which one a run sees depends on MPI's progress.
  uint64_t grads_least = 0, grads_bound = 0;
};

// NCCL's connection buffers on one rank of a device run, an estimate to be measured on the first GPU.
// NCCL (documentation, environment variables NCCL_BUFFSIZE and NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS)
// gives each connection a buffer per channel, NCCL_BUFFSIZE bytes (4 MiB by default), and picks the
// number of channels per topology (up to 32 on NVLink nodes such as H100/H200 ones); point-to-point
// connections take buffers per channel too. The estimate: every connection the step uses
// (parallel/mesh.h device_comm_use; the trainer warms them all before step 1) holds `channels` x
// `buff_bytes`: one for the collectives of each device communicator that runs them (the ring; the
// tree and NVLink SHARP buffers, and the protocols' other buffers, are not counted) and one per
// point-to-point peer. The device communicators are the trainer's, by the one rule both use
// (parallel/mesh.h device_comm_size): tp and ep when they have two or more ranks, dp and the
// expert-data group under ZeRO or with two or more, pp. Zero on
// the CPU (no NCCL) and for groups of one rank. For pipeline rank `pp_rank` (a stage without mixture
// layers has no expert-data communicator).
struct NcclAssumption {
  uint64_t buff_bytes = uint64_t(4) << 20;  // NCCL_BUFFSIZE's default
  int channels = 32;                        // the most NCCL opens on an NVLink node: an upper figure
};
uint64_t plan_nccl_bytes(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank,
                         const NcclAssumption& a = {});
// The connections behind it: communicators whose collectives connect, and point-to-point peers.
struct NcclConnections {
  int rings = 0, peers = 0;
};
NcclConnections plan_nccl_connections(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank);

// The schedule simulator's figures for the layout's pipeline (equal unit costs): its bubble over the
// ideal time and the micro-batches of activations each rank holds at its peak. One rank: none.
struct PipelineFigures {
  double bubble_over_ideal = 0;
  std::vector<double> peak_micro_batches;  // per pp rank
  // Per pp rank, each point of its action list where what it holds grows: how many (chunk, micro)
  // pairs hold their forward's activations, how many (zb1) have run B_input and wait for W, and
  // whether one is inside its B_input then (holding the larger of the two).
  struct Held {
    int forward = 0, split = 0;
    bool in_b = false;
  };
  std::vector<std::vector<Held>> held;
  bool split = false;  // zb1: B_input and W apart
};
PipelineFigures pipeline_figures(const config::TrainOptions& o, const parallel::MeshLayout& l);

// The figures for pipeline rank `pp_rank` (model state and activations differ by stage).
MemoryPlan plan_memory(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank);
MemoryPlan plan_memory(const config::TrainOptions& o, const parallel::MeshLayout& l, int pp_rank, const PipelineFigures& pipe);
// The pipeline rank with the largest total, and its figures.
MemoryPlan plan_memory_worst(const config::TrainOptions& o, const parallel::MeshLayout& l);
MemoryPlan plan_memory_worst(const config::TrainOptions& o, const parallel::MeshLayout& l, const PipelineFigures& pipe);

}  // namespace mt::plan
