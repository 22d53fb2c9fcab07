#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "runtime/check.h"

namespace mt::train {

float lr_at(const OptimOptions& o, int step, int total) {
  if (o.warmup_steps > 0 && step < o.warmup_steps) return o.lr * float(step + 1) / float(o.warmup_steps);
  if (o.schedule == LrSchedule::constant) return o.lr;
  const float min_lr = o.lr * o.min_lr_ratio;
  const int decay_steps = std::max(1, total - 1 - o.warmup_steps);
  const float frac = std::clamp(float(step - o.warmup_steps) / float(decay_steps), 0.f, 1.f);
  if (o.schedule == LrSchedule::linear) return o.lr + (min_lr - o.lr) * frac;
  // Cosine decay (Loshchilov & Hutter 2017, without restarts).
  const float coeff = 0.5f * (1.f + std::cos(float(M_PI) * frac));
  return min_lr + coeff * (o.lr - min_lr);
}

AdamW::AdamW(const OptimOptions& o, ParamStore& store, Arena& arena, int64_t begin, int64_t end)
    : o_(o), store_(store), begin_(begin), end_(end < 0 ? store.total_numel() : end) {
  MT_CHECK(store.finalized(), "AdamW over a ParamStore that is not finalized");
  MT_CHECK(0 <= begin_ && begin_ <= end_ && end_ <= store.total_numel(), "bad optimizer range [%lld, %lld)",
           (long long)begin_, (long long)end_);
  m_ = arena.alloc(MemCategory::optimizer, size_t(end_ - begin_) * sizeof(float));
  v_ = arena.alloc(MemCategory::optimizer, size_t(end_ - begin_) * sizeof(float));
}

void AdamW::step(float lr, int t, const ops::Ctx& ctx) {
  // Walk the entries overlapping [begin, end); padding between entries is updated with the
  // following entry's decay flag (its gradient and weight are zero, so it stays zero).
  int64_t pos = begin_;
  for (const ParamEntry& e : store_.entries()) {
    const int64_t lo = std::max(pos, begin_);
    const int64_t hi = std::min(e.offset + e.numel, end_);
    if (hi <= lo) {
      if (e.offset >= end_) break;
      continue;
    }
    const float wd = e.weight_decay ? o_.weight_decay : 0.f;
    ops::adamw(store_.master() + lo, m() + (lo - begin_), v() + (lo - begin_), store_.grads() + lo, hi - lo, lr,
               o_.beta1, o_.beta2, o_.eps, wd, t, ctx);
    pos = hi;
  }
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
