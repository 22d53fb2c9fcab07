// AdamW over a shard of a ParamStore, the learning-rate schedule and fp16 loss scaling.
// The optimizer updates a list of flat ranges (segments) of the store whose values are stored
// concatenated: the whole store for one rank, or a ZeRO shard (parallel/data_parallel.h). Weight
// decay follows each parameter entry's flag.
#pragma once
#include <cstdint>

#include "config/options.h"
#include "kernels/ops.h"
#include "parallel/data_parallel.h"
#include "runtime/arena.h"
#include "runtime/param_store.h"

namespace mt::train {

// Learning rate at optimizer step `step` (0-based) of `total` steps: linear warmup from lr/warmup
// to lr, then cosine or linear decay to lr * min_lr_ratio at the last step, or constant.
float lr_at(const config::OptimOptions& o, int step, int total);

class AdamW {
 public:
  AdamW(const config::OptimOptions& o, const ParamStore& store, std::vector<parallel::Segment> segments, Arena& arena);
  // One update with step count t >= 1 at learning rate lr. `master` and `grads` hold the segments'
  // values concatenated; each gradient is multiplied by *grad_scale (one float in device memory: the
  // unscale-and-clip factor, ops::clip_coefficient) when given, else used as it is.
  void step(float* master, const float* grads, float lr, int t, const ops::Ctx& ctx,
            const float* grad_scale = nullptr);
  float* m() const { return m_.f32(); }
  float* v() const { return v_.f32(); }
  int64_t numel() const { return numel_; }

 private:
  config::OptimOptions o_;
  // Runs of equal weight decay within the concatenated shard: [begin, end) and the decay to apply.
  struct Run {
    int64_t begin, end;
    float weight_decay;
  };
  std::vector<Run> runs_;
  int64_t numel_ = 0;
  Buffer m_, v_;  // numel_ each, category optimizer
};

// Dynamic loss scale for fp16; a no-op scale of 1 for other precisions.
class LossScaler {
 public:
  LossScaler(const config::LossScaleOptions& o, bool enabled)
      : enabled_(enabled), scale_(enabled ? o.init_scale : 1.f), growth_interval_(o.growth_interval) {}
  float scale() const { return scale_; }
  bool enabled() const { return enabled_; }
  // Records the outcome of a step: on overflow halves the scale (the caller skips the update);
  // after growth_interval clean steps in a row doubles it.
  void update(bool overflow);
  int clean_steps() const { return clean_; }
  void restore(float scale, int clean) {
    scale_ = scale;
    clean_ = clean;
  }

 private:
  bool enabled_;
  float scale_;
  int growth_interval_;
  int clean_ = 0;
};

}  // namespace mt::train
