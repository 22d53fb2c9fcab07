// AdamW over a ParamStore range, the learning-rate schedule, gradient clipping and fp16 loss scaling.
// The optimizer works on a contiguous [begin, end) range of the flat buffers so that ZeRO can give
// each data-parallel rank its own shard; weight decay follows each parameter entry's flag.
#pragma once
#include <cstdint>

#include "kernels/ops.h"
#include "runtime/arena.h"
#include "runtime/param_store.h"
#include "train/options.h"

namespace mt::train {

// Learning rate at optimizer step `step` (0-based) of `total` steps: linear warmup from lr/warmup
// to lr, then cosine or linear decay to lr * min_lr_ratio at the last step, or constant.
float lr_at(const OptimOptions& o, int step, int total);

class AdamW {
 public:
  AdamW(const OptimOptions& o, ParamStore& store, Arena& arena, int64_t begin = 0, int64_t end = -1);
  // One update with step count t >= 1 at learning rate lr on [begin, end) of the master weights,
  // reading the gradients as they are (the caller has unscaled and clipped them).
  void step(float lr, int t, const ops::Ctx& ctx);
  float* m() const { return m_.f32(); }
  float* v() const { return v_.f32(); }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

 private:
  OptimOptions o_;
  ParamStore& store_;
  int64_t begin_, end_;
  Buffer m_, v_;  // (end - begin) each, category optimizer
};

// Dynamic loss scale for fp16; a no-op scale of 1 for other precisions.
class LossScaler {
 public:
  LossScaler(const LossScaleOptions& o, bool enabled)
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
