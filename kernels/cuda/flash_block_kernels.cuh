// Block flash attention for ring attention (see flash_block.cu): the CUDA twin of
// kernels/cpu/flash_attention_block.cpp, in a header so that the same source builds by nvcc and by
// the host compiler against the warp emulator (tests/test_emu_flash_block.cpp).
//
// A query block (B, Tq) meets a key/value block (B, Tk); every row carries its global position and,
// optionally, its document id, and key j is visible to query i iff k_pos[j] <= q_pos[i] and the ids
// are equal. A query may see no key of the block: its output is 0 and its log-sum-exp -inf. The
// forward writes fp32, normalised by the block's own sum (attention_merge combines the parts); the
// backward takes the FINAL lse and delta and ADDS to fp32 dq, dk, dv.
//
// The tile machinery is flash_attention_kernels.cuh's (8 warps x 8 rows, lanes over 2 columns of the
// 64-wide score tile and over the head dimensions); what differs is the visibility rule, which reads
// positions and ids staged per tile, and a tile pair that no query can see is skipped whole (decided
// by every thread voting into one shared flag).
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda::flash_block_kernels {

using flash_attention_kernels::kColsPerLane;
using flash_attention_kernels::kRowsPerWarp;
using flash_attention_kernels::kThreads;
using flash_attention_kernels::kTile;
using flash_attention_kernels::kWarps;
using flash_attention_kernels::load_tile;
using flash_attention_kernels::score_pair;

// Rows past the block: a query at position -1 sees nothing, a key at INT32_MAX is seen by nothing.
constexpr int32_t kNoQuery = -1;
constexpr int32_t kNoKey = 0x7fffffff;

// Positions and document ids (0 without ids) of rows t0 .. t0+63 of batch row b into shared memory.
__device__ inline void load_rows_meta(int* pos_s, int* doc_s, const int32_t* pos, const int32_t* doc, int b, int t0,
                                      int T, int32_t past) {
  for (int r = int(threadIdx.x); r < kTile; r += kThreads) {
    const int t = t0 + r;
    pos_s[r] = t < T ? pos[t] : past;
    doc_s[r] = t < T && doc ? doc[int64_t(b) * T + t] : 0;
  }
}

__device__ inline bool visible(int qpos, int qdoc, int kpos, int kdoc) { return kpos <= qpos && qdoc == kdoc; }

// Whether any pair of the (row tile, column tile) is visible: every thread checks its 8 x 2 pairs and
// raises the shared flag; uniform across the block after the barrier. `rows_are_queries`: the warps'
// rows are queries (forward, dQ) or keys (dK/dV).
__device__ inline bool tile_pair_visible(int* flag, const int* row_pos, const int* row_doc, const int* col_pos,
                                         const int* col_doc, bool rows_are_queries, int warp, int lane) {
  if (threadIdx.x == 0) *flag = 0;
  __syncthreads();
  bool any = false;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++)
#pragma unroll
    for (int c = 0; c < kColsPerLane; c++) {
      const int rr = warp * kRowsPerWarp + r, cc = lane + c * kWarp;
      any |= rows_are_queries ? visible(row_pos[rr], row_doc[rr], col_pos[cc], col_doc[cc])
                              : visible(col_pos[cc], col_doc[cc], row_pos[rr], row_doc[rr]);
    }
  if (any) *flag = 1;  // every writer writes the same value
  __syncthreads();
  return *flag != 0;
}

// Shared-memory bytes of each kernel for head size hs (tiles in floats, then 5 x 64 ints).
constexpr size_t fwd_smem_bytes(int hs) {
  return (size_t(kTile) * hs * 2 + size_t(kTile) * (hs + 1) + size_t(kWarps) * kRowsPerWarp * kTile) * 4 +
         (4 * kTile + 1) * 4;
}
constexpr size_t dkdv_smem_bytes(int hs) {
  return (size_t(kTile) * (hs + 1) * 2 + size_t(kTile) * hs * 2 + size_t(kWarps) * kRowsPerWarp * kTile * 2 +
          2 * kTile) * 4 + (4 * kTile + 1) * 4;
}
constexpr size_t dq_smem_bytes(int hs) {
  return (size_t(kTile) * hs * 2 + size_t(kTile) * (hs + 1) * 2 + size_t(kWarps) * kRowsPerWarp * kTile) * 4 +
         (4 * kTile + 1) * 4;
}

// One thread block per (64-query tile, head, batch row), over every key tile of the block.
template <class D, int ND>
__global__ void __launch_bounds__(kThreads)
    block_fwd_kernel(float* out, float* lse, const D* q, int ldq, const D* k, const D* v, int ldkv,
                     const int32_t* q_pos, const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int Tq,
                     int Tk, int C, int NH, float scale) {
  MT_DYNAMIC_SHARED(float, smem);
  const int hs = C / NH, ks = hs + 1;
  float* Qs = smem;              // (64, hs), broadcast
  float* Vs = Qs + kTile * hs;   // (64, hs), lanes over dimensions
  float* Ks = Vs + kTile * hs;   // (64, hs + 1), lanes over keys
  float* Ps = Ks + kTile * ks;   // per warp (8, 64)
  int* qpos_s = reinterpret_cast<int*>(Ps + kWarps * kRowsPerWarp * kTile);
  int* qdoc_s = qpos_s + kTile;
  int* kpos_s = qdoc_s + kTile;
  int* kdoc_s = kpos_s + kTile;
  int* flag = kdoc_s + kTile;
  const int q0 = int(blockIdx.x) * kTile, h = int(blockIdx.y), b = int(blockIdx.z);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const D* qh = q + int64_t(b) * Tq * ldq + int64_t(h) * hs;
  const D* kh = k + int64_t(b) * Tk * ldkv + int64_t(h) * hs;
  const D* vh = v + int64_t(b) * Tk * ldkv + int64_t(h) * hs;
  float* P = Ps + warp * kRowsPerWarp * kTile;

  load_tile(Qs, hs, qh, ldq, q0, Tq, hs);
  load_rows_meta(qpos_s, qdoc_s, q_pos, q_doc, b, q0, Tq, kNoQuery);
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][ND];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < ND; e++) o[r][e] = 0.f;
  }

  for (int k0 = 0; k0 < Tk; k0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    load_rows_meta(kpos_s, kdoc_s, k_pos, k_doc, b, k0, Tk, kNoKey);
    if (!tile_pair_visible(flag, qpos_s, qdoc_s, kpos_s, kdoc_s, true, warp, lane)) continue;
    load_tile(Ks, ks, kh, ldkv, k0, Tk, hs);
    load_tile(Vs, hs, vh, ldkv, k0, Tk, hs);
    __syncthreads();

    float s[kRowsPerWarp][kColsPerLane] = {};
    flash_attention_kernels::score_tile(s, Qs, Ks, ks, hs, warp, lane);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++)
#pragma unroll
      for (int c = 0; c < kColsPerLane; c++) {
        const int rr = warp * kRowsPerWarp + r, jj = lane + c * kWarp;
        s[r][c] = visible(qpos_s[rr], qdoc_s[rr], kpos_s[jj], kdoc_s[jj]) ? s[r][c] * scale : -INFINITY;
      }
    flash_attention_kernels::online_softmax_tile<ND>(s, m, l, o, P, Vs, min(kTile, Tk - k0), hs, lane);
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const int i = q0 + warp * kRowsPerWarp + r;
    if (i >= Tq) continue;
    const bool seen = l[r] > 0.f;
    const float inv = seen ? 1.f / l[r] : 0.f;
    float* y = out + (int64_t(b) * Tq + i) * C + int64_t(h) * hs;
#pragma unroll
    for (int e = 0; e < ND; e++)
      if (lane + e * kWarp < hs) y[lane + e * kWarp] = o[r][e] * inv;
    if (lane == 0) lse[(int64_t(b) * NH + h) * Tq + i] = seen ? m[r] + logf(l[r]) : -INFINITY;
  }
}

// dK, dV += of the 64 keys of one tile (the warps' rows), over every query tile of the block.
template <class D, int ND>
__global__ void __launch_bounds__(kThreads)
    block_bwd_dkdv_kernel(float* dk, float* dv, int lddkv, const D* dout, const D* q, int ldq, const D* k,
                          const D* v, int ldkv, const float* lse, const float* delta, const int32_t* q_pos,
                          const int32_t* k_pos, const int32_t* q_doc, const int32_t* k_doc, int Tq, int Tk, int C,
                          int NH, float scale) {
  MT_DYNAMIC_SHARED(float, smem);
  const int hs = C / NH, ps = hs + 1;
  float* Ks = smem;                  // (64, hs), broadcast
  float* Vs = Ks + kTile * hs;       // (64, hs), broadcast
  float* Qs = Vs + kTile * hs;       // (64, hs + 1), lanes over queries, then over dimensions
  float* dOs = Qs + kTile * ps;      // (64, hs + 1), same
  float* Ps = dOs + kTile * ps;      // per warp (8, 64)
  float* dSs = Ps + kWarps * kRowsPerWarp * kTile;
  float* lse_s = dSs + kWarps * kRowsPerWarp * kTile;
  float* delta_s = lse_s + kTile;
  int* kpos_s = reinterpret_cast<int*>(delta_s + kTile);
  int* kdoc_s = kpos_s + kTile;
  int* qpos_s = kdoc_s + kTile;
  int* qdoc_s = qpos_s + kTile;
  int* flag = qdoc_s + kTile;
  const int k0 = int(blockIdx.x) * kTile, h = int(blockIdx.y), b = int(blockIdx.z);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const D* qh = q + int64_t(b) * Tq * ldq + int64_t(h) * hs;
  const D* dh = dout + int64_t(b) * Tq * C + int64_t(h) * hs;
  const int64_t stat0 = (int64_t(b) * NH + h) * Tq;
  float* P = Ps + warp * kRowsPerWarp * kTile;
  float* dS = dSs + warp * kRowsPerWarp * kTile;

  load_tile(Ks, hs, k + int64_t(b) * Tk * ldkv + int64_t(h) * hs, ldkv, k0, Tk, hs);
  load_tile(Vs, hs, v + int64_t(b) * Tk * ldkv + int64_t(h) * hs, ldkv, k0, Tk, hs);
  load_rows_meta(kpos_s, kdoc_s, k_pos, k_doc, b, k0, Tk, kNoKey);
  float dkr[kRowsPerWarp][ND] = {}, dvr[kRowsPerWarp][ND] = {};

  for (int q0 = 0; q0 < Tq; q0 += kTile) {
    __syncthreads();
    load_rows_meta(qpos_s, qdoc_s, q_pos, q_doc, b, q0, Tq, kNoQuery);
    for (int r = int(threadIdx.x); r < kTile; r += kThreads) {
      // A query that sees no key anywhere (lse -inf) has no gradient: as if it were past the block.
      const bool in = q0 + r < Tq && lse[stat0 + q0 + r] != -INFINITY;
      lse_s[r] = in ? lse[stat0 + q0 + r] : 0.f;
      delta_s[r] = in ? delta[stat0 + q0 + r] : 0.f;
      if (!in) qpos_s[r] = kNoQuery;
    }
    if (!tile_pair_visible(flag, kpos_s, kdoc_s, qpos_s, qdoc_s, false, warp, lane)) continue;
    load_tile(Qs, ps, qh, ldq, q0, Tq, hs);
    load_tile(dOs, ps, dh, C, q0, Tq, hs);
    __syncthreads();

    float s[kRowsPerWarp][kColsPerLane] = {}, dp[kRowsPerWarp][kColsPerLane] = {};
    score_pair(s, dp, Ks, Vs, Qs, dOs, ps, hs, warp, lane);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      const int rr = warp * kRowsPerWarp + r;
#pragma unroll
      for (int c = 0; c < kColsPerLane; c++) {
        const int ii = lane + c * kWarp;
        const float p =
            visible(qpos_s[ii], qdoc_s[ii], kpos_s[rr], kdoc_s[rr]) ? expf(s[r][c] * scale - lse_s[ii]) : 0.f;
        P[r * kTile + ii] = p;
        dS[r * kTile + ii] = p * (dp[r][c] - delta_s[ii]);
      }
    }
    __syncwarp();
    flash_attention_kernels::accumulate_dkdv<ND>(dkr, dvr, P, dS, Qs, dOs, ps, min(kTile, Tq - q0), hs, lane);
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const int j = k0 + warp * kRowsPerWarp + r;
    if (j >= Tk) continue;
    float* dkrow = dk + (int64_t(b) * Tk + j) * lddkv + int64_t(h) * hs;
    float* dvrow = dv + (int64_t(b) * Tk + j) * lddkv + int64_t(h) * hs;
#pragma unroll
    for (int e = 0; e < ND; e++) {
      const int d = lane + e * kWarp;
      if (d < hs) {
        dkrow[d] += dkr[r][e] * scale;
        dvrow[d] += dvr[r][e];
      }
    }
  }
}

// dQ += of the 64 queries of one tile (the warps' rows), over every key tile of the block.
template <class D, int ND>
__global__ void __launch_bounds__(kThreads)
    block_bwd_dq_kernel(float* dq, const D* dout, const D* q, int ldq, const D* k, const D* v, int ldkv,
                        const float* lse, const float* delta, const int32_t* q_pos, const int32_t* k_pos,
                        const int32_t* q_doc, const int32_t* k_doc, int Tq, int Tk, int C, int NH, float scale) {
  MT_DYNAMIC_SHARED(float, smem);
  const int hs = C / NH, ks = hs + 1;
  float* Qs = smem;               // (64, hs), broadcast
  float* dOs = Qs + kTile * hs;   // (64, hs), broadcast
  float* Ks = dOs + kTile * hs;   // (64, hs + 1), lanes over keys, then over dimensions
  float* Vs = Ks + kTile * ks;    // (64, hs + 1), lanes over keys
  float* dSs = Vs + kTile * ks;   // per warp (8, 64)
  int* qpos_s = reinterpret_cast<int*>(dSs + kWarps * kRowsPerWarp * kTile);
  int* qdoc_s = qpos_s + kTile;
  int* kpos_s = qdoc_s + kTile;
  int* kdoc_s = kpos_s + kTile;
  int* flag = kdoc_s + kTile;
  const int q0 = int(blockIdx.x) * kTile, h = int(blockIdx.y), b = int(blockIdx.z);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const D* kh = k + int64_t(b) * Tk * ldkv + int64_t(h) * hs;
  const D* vh = v + int64_t(b) * Tk * ldkv + int64_t(h) * hs;
  const int64_t stat0 = (int64_t(b) * NH + h) * Tq;
  float* dS = dSs + warp * kRowsPerWarp * kTile;

  load_tile(Qs, hs, q + int64_t(b) * Tq * ldq + int64_t(h) * hs, ldq, q0, Tq, hs);
  load_tile(dOs, hs, dout + int64_t(b) * Tq * C + int64_t(h) * hs, C, q0, Tq, hs);
  load_rows_meta(qpos_s, qdoc_s, q_pos, q_doc, b, q0, Tq, kNoQuery);
  float row_lse[kRowsPerWarp], row_delta[kRowsPerWarp], dqr[kRowsPerWarp][ND] = {};
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const int i = q0 + warp * kRowsPerWarp + r;
    row_lse[r] = i < Tq ? lse[stat0 + i] : -INFINITY;
    row_delta[r] = i < Tq ? delta[stat0 + i] : 0.f;
  }
  __syncthreads();
  // A query that sees no key anywhere (lse -inf) has no gradient: as if it were past the block.
  for (int r = int(threadIdx.x); r < kTile; r += kThreads)
    if (q0 + r >= Tq || lse[stat0 + q0 + r] == -INFINITY) qpos_s[r] = kNoQuery;

  for (int k0 = 0; k0 < Tk; k0 += kTile) {
    __syncthreads();
    load_rows_meta(kpos_s, kdoc_s, k_pos, k_doc, b, k0, Tk, kNoKey);
    if (!tile_pair_visible(flag, qpos_s, qdoc_s, kpos_s, kdoc_s, true, warp, lane)) continue;
    load_tile(Ks, ks, kh, ldkv, k0, Tk, hs);
    load_tile(Vs, ks, vh, ldkv, k0, Tk, hs);
    __syncthreads();

    float s[kRowsPerWarp][kColsPerLane] = {}, dp[kRowsPerWarp][kColsPerLane] = {};
    score_pair(s, dp, Qs, dOs, Ks, Vs, ks, hs, warp, lane);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      const int rr = warp * kRowsPerWarp + r;
#pragma unroll
      for (int c = 0; c < kColsPerLane; c++) {
        const int jj = lane + c * kWarp;
        const float p =
            visible(qpos_s[rr], qdoc_s[rr], kpos_s[jj], kdoc_s[jj]) ? expf(s[r][c] * scale - row_lse[r]) : 0.f;
        dS[r * kTile + jj] = p * (dp[r][c] - row_delta[r]);
      }
    }
    __syncwarp();
    flash_attention_kernels::accumulate_dq<ND>(dqr, dS, Ks, ks, min(kTile, Tk - k0), hs, lane);
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const int i = q0 + warp * kRowsPerWarp + r;
    if (i >= Tq) continue;
    float* row = dq + (int64_t(b) * Tq + i) * C + int64_t(h) * hs;
#pragma unroll
    for (int e = 0; e < ND; e++)
      if (lane + e * kWarp < hs) row[lane + e * kWarp] += dqr[r][e] * scale;
  }
}

// attention_merge: one warp per (b, h, t); with L = log(e^lse + e^part), out = e^(lse - L) out +
// e^(part - L) part_out. A side with lse -inf contributes nothing.
__global__ void merge_kernel(float* out, float* lse, const float* part_out, const float* part_lse, int B, int T, int C,
                             int NH) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= int64_t(B) * NH * T) return;
  const int hs = C / NH, t = int(row % T), h = int((row / T) % NH), b = int(row / (int64_t(T) * NH));
  const float L1 = lse[row], L2 = part_lse[row];
  if (L2 == -INFINITY) return;
  float* o = out + (int64_t(b) * T + t) * C + int64_t(h) * hs;
  const float* o2 = part_out + (int64_t(b) * T + t) * C + int64_t(h) * hs;
  float w1 = 0.f, w2 = 1.f, L = L2;
  if (L1 != -INFINITY) {
    const float mx = fmaxf(L1, L2);
    L = mx + logf(expf(L1 - mx) + expf(L2 - mx));
    w1 = expf(L1 - L), w2 = expf(L2 - L);
  }
  for (int d = lane; d < hs; d += kWarp) o[d] = w1 * o[d] + w2 * o2[d];
  __syncwarp();
  if (lane == 0) lse[row] = L;
}

// copy_columns: dst[r, c] = src[r, c] for c < cols, a grid-stride loop over the rows x cols elements.
template <class D>
__global__ void copy_columns_kernel(D* dst, int64_t ld_dst, const D* src, int64_t ld_src, int64_t rows,
                                    int64_t cols) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols; i += stride)
    dst[(i / cols) * ld_dst + i % cols] = src[(i / cols) * ld_src + i % cols];
}

// A block of kThreads per (64-row tile, head, batch row) over the tile kernel's rows (Tq or Tk).
inline LaunchShape tile_shape(int B, int rows, int NH, size_t smem) {
  return {dim3(ceil_div(rows, kTile), unsigned(NH), unsigned(B)), dim3(kThreads), smem};
}
inline LaunchShape merge_shape(int64_t rows) { return {dim3(ceil_div(rows, kWarps)), dim3(kThreads)}; }
inline LaunchShape copy_columns_shape(int64_t n) { return {dim3(grid_for(n)), dim3(kBlock)}; }

}  // namespace mt::cuda::flash_block_kernels
