// The pipeline's layout rules: stages and their layers, the schedule and message pairing the options
// name, and the checks that refuse a pipeline before any work (config/layout_rules.cpp). The runtime
// pipeline that follows these rules is train/pipeline.h.
#pragma once
#include <cstdint>
#include <vector>

#include "config/options.h"
#include "model/gpt.h"
#include "parallel/pipeline_executor.h"
#include "parallel/pipeline_schedule.h"

namespace mt::config {

// Fails with one line naming the option unless the pipeline options fit the model: pp.schedule and
// pp.virtual (parallel/pipeline_schedule.h's rules, with grad_accum micro-batches), every stage at
// least one layer (pp x pp.virtual <= n_layer), pp.layers with one positive count per stage summing
// to n_layer, interleaved with n_layer divisible by pp x pp.virtual unless pp.layers is given; on cuda
// not pp.exchange=ahead. (With paired exchanges, cuda or pp.exchange=paired, check_exchanges runs as an
// internal check: every schedule passes it.) (With --device cuda, context parallelism and mixtures of experts are refused where
// their own options are checked.) Nothing to check with pp = 1 beyond pp.virtual = 1 and no pp.layers.
void check_pipeline_options(const TrainOptions& o);
parallel::ScheduleSpec pipeline_spec(const TrainOptions& o);
// How the executor issues messages: pp.exchange, or with auto paired on cuda (NCCL) and ahead on the CPU.
parallel::Pairing pipeline_pairing(const TrainOptions& o);
// Layers of each of the pp x pp.virtual stages: pp.layers as given; equal chunks under interleaved;
// otherwise balanced_layers by the model's FLOPs per token (the classifier's on the last stage).
std::vector<int> stage_layers(const TrainOptions& o);
// The contiguous split of L layers (each costing `layer`) into S stages, at least one layer each,
// that minimises the largest stage cost (stage 0 adds first_extra, stage S-1 last_extra), then the sum
// of the squared stage costs; among equal splits, the later stages hold more layers.
std::vector<int> balanced_layers(int L, int S, int64_t layer, int64_t first_extra, int64_t last_extra);
// The chunks pipeline rank `pp_rank` holds.
model::StagePlan stage_plan(const TrainOptions& o, int pp_rank);

}  // namespace mt::config
