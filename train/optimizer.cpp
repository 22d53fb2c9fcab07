#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "runtime/check.h"

namespace mt::train {

float lr_at(const config::OptimOptions& o, int step, int total) {
  if (o.warmup_steps > 0 && step < o.warmup_steps) return o.lr * float(step + 1) / float(o.warmup_steps);
  if (o.schedule == config::LrSchedule::constant) return o.lr;
  const float min_lr = o.lr * o.min_lr_ratio;
  const int decay_steps = std::max(1, total - 1 - o.warmup_steps);
  const float frac = std::clamp(float(step - o.warmup_steps) / float(decay_steps), 0.f, 1.f);
  if (o.schedule == config::LrSchedule::linear) return o.lr + (min_lr - o.lr) * frac;
  // Cosine decay (Loshchilov & Hutter 2017, without restarts).
  const float coeff = 0.5f * (1.f + std::cos(float(M_PI) * frac));
  return min_lr + coeff * (o.lr - min_lr);
}

AdamW::AdamW(const config::OptimOptions& o, const ParamStore& store, std::vector<parallel::Segment> segments, Arena& arena)
    : o_(o) {
  MT_CHECK(store.finalized(), "AdamW over a ParamStore that is not finalized");
  // Split each segment where the weight-decay flag changes. Padding after an entry takes the flag of
  // the entry before it (its gradient and weight are zero, so it stays zero either way).
  int64_t pos = 0;
  for (const parallel::Segment& seg : segments) {
    int64_t at = seg.begin;
    while (at < seg.end) {
      const ParamEntry* owner = nullptr;
      for (const ParamEntry& e : store.entries())
        if (e.offset <= at) owner = &e;  // entries are in offset order: the last one starting at or before `at`
      const ParamEntry* next = nullptr;
      for (const ParamEntry& e : store.entries())
        if (e.offset > at) {
          next = &e;
          break;
        }
      const int64_t stop = std::min(seg.end, next ? next->offset : seg.end);
      const float wd = owner && owner->weight_decay ? o.weight_decay : 0.f;
      if (!runs_.empty() && runs_.back().end == pos && runs_.back().weight_decay == wd)
        runs_.back().end = pos + (stop - at);
      else
        runs_.push_back(Run{pos, pos + (stop - at), wd});
      pos += stop - at;
      at = stop;
    }
  }
  numel_ = pos;
  m_ = arena.alloc(MemCategory::optimizer, size_t(numel_) * sizeof(float));
  v_ = arena.alloc(MemCategory::optimizer, size_t(numel_) * sizeof(float));
}

void AdamW::step(float* master, const float* grads, float lr, int t, const ops::Ctx& ctx, const float* grad_scale) {
  for (const Run& r : runs_)
    ops::adamw(master + r.begin, m() + r.begin, v() + r.begin, grads + r.begin, r.end - r.begin, lr, o_.beta1,
               o_.beta2, o_.eps, r.weight_decay, t, ctx, grad_scale);
}

void LossScaler::update(bool overflow) {
  if (!enabled_) return;
  if (overflow) {
    scale_ = std::max(scale_ * 0.5f, 1.f);
    clean_ = 0;
  } else if (++clean_ >= growth_interval_) {
    scale_ *= 2.f;
    clean_ = 0;
  }
}

}  // namespace mt::train
