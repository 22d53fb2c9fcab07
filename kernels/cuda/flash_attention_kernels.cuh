// The fp32 SIMT flash attention kernels (see flash_attention.cu) and their launch shapes, in a header so
// that the same source builds twice: by nvcc for the GPU, and by the host compiler against the warp
// emulator (warp_emulation.h), on which tests/test_emu_flash_attention.cpp runs them against the CPU twin.
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda::flash_attention_kernels {

constexpr int kMaxHeadSize = 128;
constexpr int kTile = 64;                 // queries per block, keys per tile (and the reverse for dK/dV)
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarp;  // 256
constexpr int kRowsPerWarp = kTile / kWarps;
constexpr int kColsPerLane = kTile / kWarp;
static_assert(kColsPerLane == 2 && kRowsPerWarp == 8, "the kernels below unroll 8 rows x 2 columns");

// Rows t0 .. t0+63 of one head's (T, hs) slice (row stride ld_src elements) into a shared tile with
// row stride ld_dst floats; rows past T are zero. Consecutive threads read consecutive elements.
template <class D>
__device__ void load_tile(float* dst, int ld_dst, const D* src, int64_t ld_src, int t0, int T, int hs) {
  for (int idx = int(threadIdx.x); idx < kTile * hs; idx += kThreads) {
    const int r = idx / hs, d = idx - r * hs;
    const int t = t0 + r;
    dst[r * ld_dst + d] = t < T ? load(src[int64_t(t) * ld_src + d]) : 0.f;
  }
}

// Document ids of rows t0 .. t0+63 (0 for all without a mask, -1 past T).
__device__ inline void load_docs(int* dst, const int32_t* doc, int t0, int T) {
  for (int r = int(threadIdx.x); r < kTile; r += kThreads) dst[r] = t0 + r < T ? (doc ? doc[t0 + r] : 0) : -1;
}

// Query i may attend to key j (both inside the sequence).
__device__ inline bool visible(int i, int j, int T, int doc_i, int doc_j) {
  return j <= i && i < T && doc_i == doc_j;
}

// The two products both backward kernels build their scores from, over the head dimension:
//   s[r][c] += a[own r][d] x[lane c][d]     dp[r][c] += b[own r][d] y[lane c][d]
// where "own r" is the warp's row warp * 8 + r of a and b (row stride hs) and "lane c" the row
// lane + 32 c of x and y (row stride ld). dK/dV: a, b = K, V and x, y = Q, dO; dQ the reverse.
__device__ inline void score_pair(float (&s)[kRowsPerWarp][kColsPerLane], float (&dp)[kRowsPerWarp][kColsPerLane],
                                  const float* a, const float* b, const float* x, const float* y, int ld, int hs,
                                  int warp, int lane) {
  for (int d = 0; d < hs; d++) {
    const float x0 = x[lane * ld + d], x1 = x[(lane + kWarp) * ld + d];
    const float y0 = y[lane * ld + d], y1 = y[(lane + kWarp) * ld + d];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      const float a_r = a[(warp * kRowsPerWarp + r) * hs + d], b_r = b[(warp * kRowsPerWarp + r) * hs + d];
      s[r][0] += a_r * x0;
      s[r][1] += a_r * x1;
      dp[r][0] += b_r * y0;
      dp[r][1] += b_r * y1;
    }
  }
}

// The forward's scores of one tile: s[r][c] = q[own r] . k[lane c] over the head dimension, with Q
// (row stride hs) read as a broadcast and K (row stride ks) across the lanes.
__device__ inline void score_tile(float (&s)[kRowsPerWarp][kColsPerLane], const float* Qs, const float* Ks, int ks,
                                  int hs, int warp, int lane) {
  for (int d = 0; d < hs; d++) {
    const float k_a = Ks[lane * ks + d], k_b = Ks[(lane + kWarp) * ks + d];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      const float q = Qs[(warp * kRowsPerWarp + r) * hs + d];
      s[r][0] += q * k_a;
      s[r][1] += q * k_b;
    }
  }
}

// The forward's online-softmax step over one key tile for a warp's 8 query rows: s holds the scaled
// scores with -inf where a key is hidden; the running max m, sum l and unnormalised outputs o absorb
// the tile, through P (this warp's 8 x 64 in shared memory) and V's first `keys` rows (row stride hs).
// A row that has seen no key yet has m = -inf, l = 0 and o = 0: its rescale factor is 0, and if the
// tile shows it nothing either, m stays -inf and every p is 0.
template <int ND>
__device__ inline void online_softmax_tile(float (&s)[kRowsPerWarp][kColsPerLane], float (&m)[kRowsPerWarp],
                                           float (&l)[kRowsPerWarp], float (&o)[kRowsPerWarp][ND], float* P,
                                           const float* Vs, int keys, int hs, int lane) {
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < kColsPerLane; c++) tile_max = fmaxf(tile_max, s[r][c]);
    const float m_new = fmaxf(m[r], warp_reduce(tile_max, MaxOp{}));
    const float alpha = m[r] == -INFINITY ? 0.f : expf(m[r] - m_new);
    float row_sum = 0.f;
#pragma unroll
    for (int c = 0; c < kColsPerLane; c++) {
      const float p = s[r][c] == -INFINITY ? 0.f : expf(s[r][c] - m_new);
      P[r * kTile + lane + c * kWarp] = p;
      row_sum += p;
    }
    l[r] = l[r] * alpha + warp_reduce(row_sum, SumOp{});
    m[r] = m_new;
#pragma unroll
    for (int e = 0; e < ND; e++) o[r][e] *= alpha;
  }
  __syncwarp();
  for (int j = 0; j < keys; j++) {
    float v[ND];
#pragma unroll
    for (int e = 0; e < ND; e++) v[e] = lane + e * kWarp < hs ? Vs[j * hs + lane + e * kWarp] : 0.f;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      const float p = P[r * kTile + j];
#pragma unroll
      for (int e = 0; e < ND; e++) o[r][e] += p * v[e];
    }
  }
  __syncwarp();  // P is rewritten by the next tile
}

// dK/dV's accumulation over one query tile for a warp's 8 key rows: dv += P^T dO, dk += dS^T Q (dk
// unscaled), with P and dS this warp's 8 x 64 and Q, dO the tile's `queries` rows (row stride ps).
template <int ND>
__device__ inline void accumulate_dkdv(float (&dk)[kRowsPerWarp][ND], float (&dv)[kRowsPerWarp][ND], const float* P,
                                       const float* dS, const float* Qs, const float* dOs, int ps, int queries, int hs,
                                       int lane) {
  for (int i = 0; i < queries; i++) {
    float q[ND], g[ND];
#pragma unroll
    for (int e = 0; e < ND; e++) {
      const bool in = lane + e * kWarp < hs;
      q[e] = in ? Qs[i * ps + lane + e * kWarp] : 0.f;
      g[e] = in ? dOs[i * ps + lane + e * kWarp] : 0.f;
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      const float p = P[r * kTile + i], ds = dS[r * kTile + i];
#pragma unroll
      for (int e = 0; e < ND; e++) {
        dv[r][e] += p * g[e];
        dk[r][e] += ds * q[e];
      }
    }
  }
  __syncwarp();
}

// dQ's accumulation over one key tile for a warp's 8 query rows: dq += dS K (unscaled), K the tile's
// `keys` rows (row stride ks).
template <int ND>
__device__ inline void accumulate_dq(float (&dq)[kRowsPerWarp][ND], const float* dS, const float* Ks, int ks, int keys,
                                     int hs, int lane) {
  for (int j = 0; j < keys; j++) {
    float k[ND];
#pragma unroll
    for (int e = 0; e < ND; e++) k[e] = lane + e * kWarp < hs ? Ks[j * ks + lane + e * kWarp] : 0.f;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
      const float ds = dS[r * kTile + j];
#pragma unroll
      for (int e = 0; e < ND; e++) dq[r][e] += ds * k[e];
    }
  }
  __syncwarp();
}

// Shared-memory floats of each kernel for head size hs.
constexpr size_t fwd_smem_floats(int hs) {
  return size_t(kTile) * hs * 2 + size_t(kTile) * (hs + 1) + size_t(kWarps) * kRowsPerWarp * kTile + kTile;
}
constexpr size_t dkdv_smem_floats(int hs) {
  return size_t(kTile) * hs * 2 + size_t(kTile) * (hs + 1) * 2 + size_t(kWarps) * kRowsPerWarp * kTile * 2 +
         3 * kTile;
}
constexpr size_t dq_smem_floats(int hs) {
  return size_t(kTile) * hs * 2 + size_t(kTile) * (hs + 1) * 2 + size_t(kWarps) * kRowsPerWarp * kTile + kTile;
}

template <class D, int ND>
__global__ void __launch_bounds__(kThreads)
    flash_fwd_kernel(D* out, float* lse, const D* qkv, const int32_t* doc, int T, int C, int NH, float scale) {
  MT_DYNAMIC_SHARED(float, smem);
  const int hs = C / NH, ks = hs + 1;
  float* Qs = smem;                               // (64, hs), read as a broadcast
  float* Vs = Qs + kTile * hs;                    // (64, hs), lanes over dimensions
  float* Ks = Vs + kTile * hs;                    // (64, hs + 1), lanes over keys
  float* Ps = Ks + kTile * ks;                    // per warp (8, 64)
  int* kdoc = reinterpret_cast<int*>(Ps + kWarps * kRowsPerWarp * kTile);
  const int q0 = int(blockIdx.x) * kTile, h = int(blockIdx.y), b = int(blockIdx.z);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int64_t ld = 3 * int64_t(C);
  const D* head = qkv + int64_t(b) * T * ld + int64_t(h) * hs;
  const int32_t* bdoc = doc ? doc + int64_t(b) * T : nullptr;
  float* P = Ps + warp * kRowsPerWarp * kTile;

  load_tile(Qs, hs, head, ld, q0, T, hs);
  int qrow[kRowsPerWarp], qdoc[kRowsPerWarp];
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][ND];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    qrow[r] = q0 + warp * kRowsPerWarp + r;
    qdoc[r] = qrow[r] < T ? (bdoc ? bdoc[qrow[r]] : 0) : -1;
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < ND; e++) o[r][e] = 0.f;
  }

  const int q_last = min(q0 + kTile, T) - 1;
  for (int k0 = 0; k0 <= q_last; k0 += kTile) {  // causal: key blocks past the diagonal are skipped
    __syncthreads();                               // the previous tile is consumed
    load_tile(Ks, ks, head + C, ld, k0, T, hs);
    load_tile(Vs, hs, head + 2 * C, ld, k0, T, hs);
    load_docs(kdoc, bdoc, k0, T);
    __syncthreads();

    float s[kRowsPerWarp][kColsPerLane] = {};
    score_tile(s, Qs, Ks, ks, hs, warp, lane);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++)
#pragma unroll
      for (int c = 0; c < kColsPerLane; c++) {
        const int jj = lane + c * kWarp;
        s[r][c] = visible(qrow[r], k0 + jj, T, qdoc[r], kdoc[jj]) ? s[r][c] * scale : -INFINITY;
      }
    online_softmax_tile<ND>(s, m, l, o, P, Vs, min(kTile, T - k0), hs, lane);
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const int i = qrow[r];
    if (i >= T) continue;
    const float inv = 1.f / l[r];  // l >= 1: every query sees itself
    D* y = out + (int64_t(b) * T + i) * C + int64_t(h) * hs;
#pragma unroll
    for (int e = 0; e < ND; e++)
      if (lane + e * kWarp < hs) y[lane + e * kWarp] = store_as<D>(o[r][e] * inv);
    if (lane == 0) lse[(int64_t(b) * NH + h) * T + i] = m[r] + logf(l[r]);
  }
}

// dsum[(b, h, i)] = sum_d dout[b, i, h, d] out[b, i, h, d]; one warp per (b, h, i).
template <class D>
__global__ void flash_dsum_kernel(float* dsum, const D* dout, const D* out, int B, int T, int C, int NH) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarp;
  const int lane = int(threadIdx.x) % kWarp;
  if (row >= int64_t(B) * NH * T) return;
  const int hs = C / NH;
  const int i = int(row % T);
  const int64_t bh = row / T;
  const int h = int(bh % NH), b = int(bh / NH);
  const int64_t off = (int64_t(b) * T + i) * C + int64_t(h) * hs;
  float s = 0.f;
  for (int d = lane; d < hs; d += kWarp) s += load(dout[off + d]) * load(out[off + d]);
  s = warp_reduce(s, SumOp{});
  if (lane == 0) dsum[row] = s;
}

// dK, dV of the 64 keys of one block (rows of the warps), looping over query tiles (lanes' columns).
template <class D, int ND>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_dkdv_kernel(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* dsum,
                          const int32_t* doc, int T, int C, int NH, float scale) {
  MT_DYNAMIC_SHARED(float, smem);
  const int hs = C / NH, ps = hs + 1;
  float* Ks = smem;                         // (64, hs), broadcast
  float* Vs = Ks + kTile * hs;              // (64, hs), broadcast
  float* Qs = Vs + kTile * hs;              // (64, hs + 1), lanes over queries, then over dimensions
  float* dOs = Qs + kTile * ps;             // (64, hs + 1), same
  float* Ps = dOs + kTile * ps;             // per warp (8, 64)
  float* dSs = Ps + kWarps * kRowsPerWarp * kTile;
  float* lse_s = dSs + kWarps * kRowsPerWarp * kTile;
  float* dsum_s = lse_s + kTile;
  int* qdoc = reinterpret_cast<int*>(dsum_s + kTile);
  const int k0 = int(blockIdx.x) * kTile, h = int(blockIdx.y), b = int(blockIdx.z);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int64_t ld = 3 * int64_t(C);
  const D* head = qkv + int64_t(b) * T * ld + int64_t(h) * hs;
  const D* dhead = dout + int64_t(b) * T * C + int64_t(h) * hs;
  const int64_t stat0 = (int64_t(b) * NH + h) * T;
  const int32_t* bdoc = doc ? doc + int64_t(b) * T : nullptr;
  float* P = Ps + warp * kRowsPerWarp * kTile;
  float* dS = dSs + warp * kRowsPerWarp * kTile;

  load_tile(Ks, hs, head + C, ld, k0, T, hs);
  load_tile(Vs, hs, head + 2 * C, ld, k0, T, hs);
  int krow[kRowsPerWarp], kdoc[kRowsPerWarp];
  float dk[kRowsPerWarp][ND] = {}, dv[kRowsPerWarp][ND] = {};
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    krow[r] = k0 + warp * kRowsPerWarp + r;
    kdoc[r] = krow[r] < T ? (bdoc ? bdoc[krow[r]] : 0) : -2;  // never equal to a query's id
  }

  for (int q0 = k0; q0 < T; q0 += kTile) {  // causal: queries before the key block see none of it
    __syncthreads();
    load_tile(Qs, ps, head, ld, q0, T, hs);
    load_tile(dOs, ps, dhead, C, q0, T, hs);
    load_docs(qdoc, bdoc, q0, T);
    for (int r = int(threadIdx.x); r < kTile; r += kThreads) {
      lse_s[r] = q0 + r < T ? lse[stat0 + q0 + r] : 0.f;
      dsum_s[r] = q0 + r < T ? dsum[stat0 + q0 + r] : 0.f;
    }
    __syncthreads();

    float s[kRowsPerWarp][kColsPerLane] = {}, dp[kRowsPerWarp][kColsPerLane] = {};
    score_pair(s, dp, Ks, Vs, Qs, dOs, ps, hs, warp, lane);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
#pragma unroll
      for (int c = 0; c < kColsPerLane; c++) {
        const int ii = lane + c * kWarp;
        const float p =
            visible(q0 + ii, krow[r], T, qdoc[ii], kdoc[r]) ? expf(s[r][c] * scale - lse_s[ii]) : 0.f;
        P[r * kTile + ii] = p;
        dS[r * kTile + ii] = p * (dp[r][c] - dsum_s[ii]);
      }
    }
    __syncwarp();
    accumulate_dkdv<ND>(dk, dv, P, dS, Qs, dOs, ps, min(kTile, T - q0), hs, lane);
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const int j = krow[r];
    if (j >= T) continue;
    D* row = dqkv + (int64_t(b) * T + j) * ld + int64_t(h) * hs;
#pragma unroll
    for (int e = 0; e < ND; e++) {
      const int d = lane + e * kWarp;
      if (d < hs) {
        row[C + d] = store_as<D>(dk[r][e] * scale);
        row[2 * C + d] = store_as<D>(dv[r][e]);
      }
    }
  }
}

// dQ of the 64 queries of one block (rows of the warps), looping over key tiles (lanes' columns).
template <class D, int ND>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_dq_kernel(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* dsum,
                        const int32_t* doc, int T, int C, int NH, float scale) {
  MT_DYNAMIC_SHARED(float, smem);
  const int hs = C / NH, ks = hs + 1;
  float* Qs = smem;                         // (64, hs), broadcast
  float* dOs = Qs + kTile * hs;             // (64, hs), broadcast
  float* Ks = dOs + kTile * hs;             // (64, hs + 1), lanes over keys, then over dimensions
  float* Vs = Ks + kTile * ks;              // (64, hs + 1), lanes over keys
  float* dSs = Vs + kTile * ks;             // per warp (8, 64)
  int* kdoc = reinterpret_cast<int*>(dSs + kWarps * kRowsPerWarp * kTile);
  const int q0 = int(blockIdx.x) * kTile, h = int(blockIdx.y), b = int(blockIdx.z);
  const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
  const int64_t ld = 3 * int64_t(C);
  const D* head = qkv + int64_t(b) * T * ld + int64_t(h) * hs;
  const int64_t stat0 = (int64_t(b) * NH + h) * T;
  const int32_t* bdoc = doc ? doc + int64_t(b) * T : nullptr;
  float* dS = dSs + warp * kRowsPerWarp * kTile;

  load_tile(Qs, hs, head, ld, q0, T, hs);
  load_tile(dOs, hs, dout + int64_t(b) * T * C + int64_t(h) * hs, C, q0, T, hs);
  int qrow[kRowsPerWarp], qdoc[kRowsPerWarp];
  float row_lse[kRowsPerWarp], row_dsum[kRowsPerWarp], dq[kRowsPerWarp][ND] = {};
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    qrow[r] = q0 + warp * kRowsPerWarp + r;
    const bool in = qrow[r] < T;
    qdoc[r] = in ? (bdoc ? bdoc[qrow[r]] : 0) : -1;
    row_lse[r] = in ? lse[stat0 + qrow[r]] : 0.f;
    row_dsum[r] = in ? dsum[stat0 + qrow[r]] : 0.f;
  }

  const int q_last = min(q0 + kTile, T) - 1;
  for (int k0 = 0; k0 <= q_last; k0 += kTile) {
    __syncthreads();
    load_tile(Ks, ks, head + C, ld, k0, T, hs);
    load_tile(Vs, ks, head + 2 * C, ld, k0, T, hs);
    load_docs(kdoc, bdoc, k0, T);
    __syncthreads();

    float s[kRowsPerWarp][kColsPerLane] = {}, dp[kRowsPerWarp][kColsPerLane] = {};
    score_pair(s, dp, Qs, dOs, Ks, Vs, ks, hs, warp, lane);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
#pragma unroll
      for (int c = 0; c < kColsPerLane; c++) {
        const int jj = lane + c * kWarp;
        const float p = visible(qrow[r], k0 + jj, T, qdoc[r], kdoc[jj]) ? expf(s[r][c] * scale - row_lse[r]) : 0.f;
        dS[r * kTile + jj] = p * (dp[r][c] - row_dsum[r]);
      }
    }
    __syncwarp();
    accumulate_dq<ND>(dq, dS, Ks, ks, min(kTile, T - k0), hs, lane);
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; r++) {
    const int i = qrow[r];
    if (i >= T) continue;
    D* row = dqkv + (int64_t(b) * T + i) * ld + int64_t(h) * hs;
#pragma unroll
    for (int e = 0; e < ND; e++)
      if (lane + e * kWarp < hs) row[lane + e * kWarp] = store_as<D>(dq[r][e] * scale);
  }
}

// Head dimensions per lane (the template argument ND of the tile kernels).
constexpr int head_chunks(int hs) { return (hs + kWarp - 1) / kWarp; }

// The tile kernels: a block of kThreads per (64-row block, head, batch row), and its shared memory.
inline dim3 tile_grid(int B, int T, int NH) { return dim3(ceil_div(T, kTile), unsigned(NH), unsigned(B)); }
inline LaunchShape fwd_shape(int B, int T, int NH, int hs) {
  return {tile_grid(B, T, NH), dim3(kThreads), fwd_smem_floats(hs) * sizeof(float)};
}
inline LaunchShape dkdv_shape(int B, int T, int NH, int hs) {
  return {tile_grid(B, T, NH), dim3(kThreads), dkdv_smem_floats(hs) * sizeof(float)};
}
inline LaunchShape dq_shape(int B, int T, int NH, int hs) {
  return {tile_grid(B, T, NH), dim3(kThreads), dq_smem_floats(hs) * sizeof(float)};
}
// flash_dsum_kernel: one warp per (b, h, i), kWarps rows per block.
inline LaunchShape dsum_shape(int64_t rows) { return {dim3(ceil_div(rows, kWarps)), dim3(kThreads)}; }

}  // namespace mt::cuda::flash_attention_kernels
