// The mixture-of-experts kernels (see moe.cu) and their launch shapes, in a header so that the same
// source builds twice: by nvcc for the GPU, and by the host compiler against the warp emulator
// (warp_emulation.h), on which tests/test_emu_moe.cpp runs them against the CPU twins
// (kernels/cpu/moe.cpp). Each kernel does the twin's arithmetic in the twin's order for its token,
// assignment or element (doubles where the twin has doubles), so the emulator agrees with the CPU bit
// for bit; on the GPU only the device's exp/log and FMA contraction differ. No atomics: the plan's
// counts come from one block per expert scanning the assignments in order.
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/moe_top_k.h"

namespace mt::cuda::moe_kernels {

constexpr int kPlanThreads = 256;  // the count kernel: one block per expert

// One thread per token: the softmax of its E logits in double (as the twin), its log-sum-exp, and its
// top-k by score p_i + bias_i, best first, ties to the lower index (an expert already chosen is
// skipped by looking back over the choices so far), with the renormalised gates.
MT_KERNEL_INLINE __global__ void route_kernel(float* probs, float* lse, double* lse_sq, int32_t* expert, float* gate,
                                              const float* logits, const float* bias, int N, int E, int K) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < N; t += int64_t(gridDim.x) * blockDim.x) {
    const float* z = logits + t * E;
    float* p = probs + t * E;
    float mx = z[0];
    for (int i = 1; i < E; i++) mx = mx < z[i] ? z[i] : mx;
    double sum = 0;
    for (int i = 0; i < E; i++) sum += exp(double(z[i]) - mx);
    for (int i = 0; i < E; i++) p[i] = float(exp(double(z[i]) - mx) / sum);
    const double l = double(mx) + log(sum);
    lse[t] = float(l);
    lse_sq[t] = l * l;
    ::mt::ops::choose_top_k(expert + t * K, gate + t * K, p, bias, E, K);
  }
}

// Block i < E: sums[i] = sum over tokens of probs[:, i]; block E: sums[E] = sum of lse_sq. In double,
// each thread over a stride of tokens, then the block's fixed reduction tree (the twin sums in token
// order: the two agree to double rounding, about 1e-16 relative).
MT_KERNEL_INLINE __global__ void route_stats_kernel(double* sums, const float* probs, const double* lse_sq, int N,
                                                    int E) {
  const int i = int(blockIdx.x);
  double s = 0;
  for (int t = int(threadIdx.x); t < N; t += int(blockDim.x))
    s += i < E ? double(probs[int64_t(t) * E + i]) : lse_sq[t];
  s = block_reduce(s, SumOp{}, 0.0);
  if (threadIdx.x == 0) sums[i] = s;
}

// One thread per token: dp_i = the balance term + the gates' term, then the softmax backward with the
// z-loss term, in double as the twin (dp_i is recomputed rather than kept: E is not known here).
MT_KERNEL_INLINE __global__ void route_bwd_kernel(float* dlogits, const float* dgate, const float* probs,
                                                  const float* lse, const int32_t* expert, const float* gate,
                                                  const int32_t* load, int N, int E, int K, double aux_weight,
                                                  double z_weight) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < N; t += int64_t(gridDim.x) * blockDim.x) {
    const float* p = probs + t * E;
    const int32_t* ex = expert + t * K;
    const float* dg = dgate + t * K;
    double s = 0, dot = 0;
    for (int j = 0; j < K; j++) s += p[ex[j]];
    for (int j = 0; j < K; j++) dot += double(dg[j]) * gate[t * K + j];
    // dp_i of the twin: daux_i, plus (dg_j - dot) / s where i is choice j (K > 1), or dg_0 (K = 1).
    auto dp = [&](int i) {
      double v = aux_weight * E * (double(load[i]) / (double(N) * K)) / N;
      for (int j = 0; j < K; j++)
        if (ex[j] == i) v += K == 1 ? double(dg[0]) : (double(dg[j]) - dot) / s;
      return v;
    };
    double pdp = 0;
    for (int i = 0; i < E; i++) pdp += double(p[i]) * dp(i);
    const double zterm = z_weight * 2.0 * lse[t] / N;
    float* dz = dlogits + t * E;
    for (int i = 0; i < E; i++) dz[i] = float(double(p[i]) * (dp(i) - pdp + zterm));
  }
}

// Block e counts expert e's assignments and gives each its position among them, in assignment order:
// the threads take contiguous segments, count, scan the counts (thread 0, in thread order), and walk
// their segments again. row_of holds the position until rows_kernel turns it into a row.
MT_KERNEL_INLINE __global__ void plan_count_kernel(int32_t* load, int32_t* row_of, const int32_t* expert,
                                                   int64_t A) {
  MT_SHARED(int32_t[kPlanThreads], start);
  const int e = int(blockIdx.x), tid = int(threadIdx.x);
  const int64_t seg = (A + kPlanThreads - 1) / kPlanThreads;
  const int64_t lo = tid * seg, hi = lo + seg < A ? lo + seg : A;
  int32_t n = 0;
  for (int64_t a = lo; a < hi; a++) n += expert[a] == e;
  start[tid] = n;
  __syncthreads();
  if (tid == 0) {
    int32_t run = 0;
    for (int k = 0; k < kPlanThreads; k++) {
      const int32_t c = start[k];
      start[k] = run;
      run += c;
    }
    load[e] = run;
  }
  __syncthreads();
  int32_t pos = start[tid];
  for (int64_t a = lo; a < hi; a++)
    if (expert[a] == e) row_of[a] = pos++;
}

// One thread: offset[e + 1] = offset[e] + the rows expert e keeps (its load, at most capacity).
MT_KERNEL_INLINE __global__ void plan_offsets_kernel(int32_t* offset, const int32_t* load, int E, int64_t capacity) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  offset[0] = 0;
  for (int e = 0; e < E; e++)
    offset[e + 1] = offset[e] + int32_t(capacity < 0 || load[e] < capacity ? load[e] : capacity);
}

// Per assignment: its position within its expert becomes its row (or -1 past the capacity), and the
// row records the assignment.
MT_KERNEL_INLINE __global__ void plan_rows_kernel(int32_t* row_of, int32_t* assignment_of, const int32_t* expert,
                                                  const int32_t* offset, int64_t A, int64_t capacity) {
  for (int64_t a = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; a < A; a += int64_t(gridDim.x) * blockDim.x) {
    const int32_t pos = row_of[a];
    if (capacity >= 0 && pos >= capacity) {
      row_of[a] = -1;
      continue;
    }
    const int32_t r = offset[expert[a]] + pos;
    row_of[a] = r;
    assignment_of[r] = int32_t(a);
  }
}

// out (M,C): row r = x[assignment_of[r] / K]; a grid-stride loop over elements.
template <class D>
__global__ void permute_kernel(D* out, const D* x, const int32_t* assignment_of, int K, int C, int64_t total) {
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / C;
    out[idx] = x[int64_t(assignment_of[r] / K) * C + (idx - r * C)];
  }
}

// out (A,C): row a = rows[row_of[a]], zero where dropped.
template <class D>
__global__ void unpermute_kernel(D* out, const D* rows, const int32_t* row_of, int C, int64_t total) {
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = idx / C;
    const int32_t r = row_of[a];
    out[idx] = r < 0 ? store_as<D>(0.f) : rows[int64_t(r) * C + (idx - a * C)];
  }
}

// dx (N,C): extra + token t's kept rows of drows in choice order, in fp32, rounded once.
template <class D>
__global__ void permute_bwd_kernel(D* dx, const D* drows, const float* extra, const int32_t* row_of, int K, int C,
                                   int64_t total) {
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / C, c = idx - t * C;
    float acc = extra ? extra[idx] : 0.f;
    for (int j = 0; j < K; j++) {
      const int32_t r = row_of[t * K + j];
      if (r >= 0) acc += load(drows[int64_t(r) * C + c]);
    }
    dx[idx] = store_as<D>(acc);
  }
}

// y (N,C): base + the gate-weighted kept rows of token t in choice order, in fp32, rounded once. base
// may alias y (each element read, then written, by one thread).
template <class D>
__global__ void combine_kernel(D* y, const D* rows, const float* gate, const D* base, const int32_t* row_of, int K,
                               int C, int64_t total) {
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / C, c = idx - t * C;
    float acc = base ? load(base[idx]) : 0.f;
    for (int j = 0; j < K; j++) {
      const int32_t r = row_of[t * K + j];
      if (r >= 0) acc += gate[t * K + j] * load(rows[int64_t(r) * C + c]);
    }
    y[idx] = store_as<D>(acc);
  }
}

// drows (M,C): gate_a dy_t for the assignment a each row holds.
template <class D>
__global__ void combine_bwd_rows_kernel(D* drows, const D* dy, const float* gate, const int32_t* assignment_of, int K,
                                        int C, int64_t total) {
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / C;
    const int32_t a = assignment_of[r];
    drows[idx] = store_as<D>(gate[a] * load(dy[int64_t(a / K) * C + (idx - r * C)]));
  }
}

// dgate (N K): one thread per assignment, <dy_t, rows[row]> in double over the columns in order (the
// twin's sum), 0 for a dropped one.
template <class D>
__global__ void combine_bwd_gate_kernel(float* dgate, const D* dy, const D* rows, const int32_t* row_of, int K, int C,
                                        int64_t A) {
  for (int64_t a = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; a < A; a += int64_t(gridDim.x) * blockDim.x) {
    const int32_t r = row_of[a];
    if (r < 0) {
      dgate[a] = 0.f;
      continue;
    }
    const D* d = dy + (a / K) * C;
    const D* src = rows + int64_t(r) * C;
    double dot = 0;
    for (int c = 0; c < C; c++) dot += double(load(d[c])) * double(load(src[c]));
    dgate[a] = float(dot);
  }
}

// Grid-stride kernels over n items (tokens, assignments or elements).
inline LaunchShape items_shape(int64_t n) { return {dim3(grid_for(n)), dim3(kBlock)}; }
inline LaunchShape stats_shape(int E) { return {dim3(unsigned(E + 1)), dim3(kBlock)}; }
inline LaunchShape plan_count_shape(int E) { return {dim3(unsigned(E)), dim3(kPlanThreads)}; }
inline LaunchShape single_shape() { return {dim3(1), dim3(kWarp)}; }  // thread 0 works

}  // namespace mt::cuda::moe_kernels
