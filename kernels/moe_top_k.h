// A token's choice of experts, one definition for the CPU twin (kernels/cpu/moe.cpp) and the CUDA
// router kernel (kernels/cuda/moe_kernels.cuh), so that the two cannot drift: the top k of the scores
// p_i + bias_i, best first, ties to the lower index (strict >; an expert already chosen is skipped by
// looking back over the choices so far), and the gates: p itself for k = 1, else the chosen
// probabilities over their sum (accumulated in double).
#pragma once
#include <cstdint>

#include "kernels/clip_coefficient.h"  // MT_HOST_DEVICE

namespace mt::ops {

// p (E): the token's probabilities; bias (E) or nullptr; expert (K) and gate (K) assigned.
MT_HOST_DEVICE inline void choose_top_k(int32_t* expert, float* gate, const float* p, const float* bias, int E, int K) {
  double gsum = 0;
  for (int j = 0; j < K; j++) {
    int best = -1;
    float best_s = 0;
    for (int i = 0; i < E; i++) {
      bool taken = false;
      for (int m = 0; m < j; m++) taken = taken || expert[m] == i;
      if (taken) continue;
      const float s = p[i] + (bias ? bias[i] : 0.f);
      if (best < 0 || s > best_s) best = i, best_s = s;
    }
    expert[j] = best;
    gsum += p[best];
  }
  for (int j = 0; j < K; j++) {
    const float pe = p[expert[j]];
    gate[j] = K == 1 ? pe : float(pe / gsum);
  }
}

}  // namespace mt::ops
