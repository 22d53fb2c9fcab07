// The critical batch from the gradient noise scale (McCandlish et al. 2018, "An Empirical Model of
// Large-Batch Training"): with B_noise the noise scale (the trainer's B_simple, in tokens), training
// to a given loss takes about
//     steps S = S_min (1 + B_noise / B)   and   tokens E = E_min (1 + B / B_noise)
// at a global batch of B tokens. Below B_noise a larger batch (more data-parallel ranks at the same
// per-rank batch) cuts the steps nearly in proportion; above it, steps barely fall and the extra
// tokens are spent for little. Doubling B multiplies the steps by (1 + B_noise / 2B) / (1 + B_noise / B):
// 0.5 far below the critical batch, 1 far above it, 2/3 at B = B_noise.
#pragma once
#include <string>

namespace mt::plan {

struct CriticalBatch {
  double noise_tokens = 0;  // B_simple
  double batch_tokens = 0;  // the global batch, in tokens
  bool below() const { return batch_tokens < noise_tokens; }
  double steps_factor_when_doubled() const;  // S(2B) / S(B)
  double tokens_factor_when_doubled() const;  // E(2B) / E(B)
  // One line: B_noise against the batch and what adding dp ranks buys.
  std::string note() const;
};

// The last gradient noise scale a run logged (metrics.jsonl's gns.b_simple): `path` is a run directory
// or its metrics.jsonl. Throws one line naming the file when it logged none (a run with dp = 1 and no
// gradient accumulation has no estimate).
double logged_noise_scale(const std::string& path);

}  // namespace mt::plan
