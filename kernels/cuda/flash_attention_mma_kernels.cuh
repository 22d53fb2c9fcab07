// The tensor-core flash attention kernels (see flash_attention_mma.cu for the algorithm) and their
// launch shapes, in a header so that the same source builds twice: by nvcc for the GPU, and by the
// host compiler against the warp emulator (warp_emulation.h, which also emulates mma.sync from the
// PTX fragment layouts), on which tests/test_emu_flash_mma.cpp runs them against the CPU twin.
#pragma once
#include <math.h>

#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda::flash_mma::kernels {

using mma::Lane;

constexpr int kTile = 64;                // rows per block, columns per score tile
constexpr int kWarps = 4;                // 16 rows each
constexpr int kLanes = 32;
constexpr int kThreads = kWarps * kLanes;
constexpr int kColTiles = kTile / 8;     // m16n8 accumulator tiles across a score tile
constexpr int kColSteps = kTile / 16;    // k16 steps across a score tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFull = 0xffffffffu;

// Shared row stride in elements: 16 bytes past a multiple of 128, so the 8 rows a fragment load
// touches start in different bank quads.
template <int HS>
constexpr int kLd = HS + 8;

// Starts copying rows t0 .. t0+ROWS-1 (row stride ld_src elements) of a head slice into a shared tile,
// 16 bytes per cp.async (the launchers check the alignment); rows past T are filled with zeros. The
// copies join the thread's next cp.async group.
template <int HS, int ROWS = kTile, class D>
__device__ inline void copy_rows_async(D* dst, const D* src, int64_t ld_src, int t0, int T) {
  constexpr int kChunks = HS / 8;
#pragma unroll
  for (int idx = int(threadIdx.x); idx < ROWS * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx - r * kChunks) * 8;
    const bool in = t0 + r < T;
    async_copy::copy16(dst + r * kLd<HS> + c, in ? src + int64_t(t0 + r) * ld_src + c : src, in);
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

// Stores two fp32 values as neighbouring elements of D, rounded as every other kernel rounds.
template <class D>
__device__ inline void store_pair(D* p, float a, float b) {
  *reinterpret_cast<uint32_t*>(p) = mma::pack_bits(mma::bits16(store_as<D>(a)), mma::bits16(store_as<D>(b)));
}

// Max and sum over the 4 lanes of a quad (the lanes holding one row of a C tile).
__device__ inline float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFull, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFull, v, 2));
}
__device__ inline float quad_sum(float v) {
  v += __shfl_xor_sync(kFull, v, 1);
  return v + __shfl_xor_sync(kFull, v, 2);
}

// The warp's RT score tiles of 16 x 64, acc[rt] = A[rt] B^T: A[rt] is one of the warp's 16-row tiles
// (KS k16 fragments over the head dimension, held in registers), B the 64 rows of a shared tile (row
// stride LD). Each B fragment is loaded once for all RT row tiles.
template <class D, int KS, int LD, int RT = 1>
__device__ inline void score_tile(float (*acc)[kColTiles][4], const uint32_t (*a)[KS][4], const D* tile, Lane ln) {
  static_assert(kColTiles % 2 == 0, "B fragments come two n8 tiles at a time");
#pragma unroll
  for (int rt = 0; rt < RT; rt++)
#pragma unroll
    for (int n = 0; n < kColTiles; n++) acc[rt][n][0] = acc[rt][n][1] = acc[rt][n][2] = acc[rt][n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < KS; kk++) {
#pragma unroll
    for (int n = 0; n < kColTiles; n += 2) {
      uint32_t b[4];
      mma::load_b2_nmajor(b, tile, LD, n * 8, kk * 16, ln);
#pragma unroll
      for (int rt = 0; rt < RT; rt++) {
        mma::mma<D>(acc[rt][n], a[rt][kk], b);
        mma::mma<D>(acc[rt][n + 1], a[rt][kk], b + 2);
      }
    }
  }
}

// out[rt] (a 16-row tile of the warp x NT * 8 head dimensions) += P[rt] V: P[rt] is a score tile in
// registers (rounded to D here), V the 64 rows of a shared tile (row stride LD), each B fragment
// loaded once for all RT row tiles.
template <class D, int NT, int LD, int RT = 1>
__device__ inline void accumulate_pv(float (*out)[NT][4], const float (*p)[kColTiles][4], const D* tile, Lane ln) {
  static_assert(NT % 2 == 0, "B fragments come two n8 tiles at a time");
#pragma unroll
  for (int j = 0; j < kColSteps; j++) {
    uint32_t a[RT][4];
#pragma unroll
    for (int rt = 0; rt < RT; rt++) mma::a_from_acc<D>(a[rt], p[rt][2 * j], p[rt][2 * j + 1]);
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t b[4];
      mma::load_b2_kmajor(b, tile, LD, n * 8, j * 16, ln);
#pragma unroll
      for (int rt = 0; rt < RT; rt++) {
        mma::mma<D>(out[rt][n], a[rt], b);
        mma::mma<D>(out[rt][n + 1], a[rt], b + 2);
      }
    }
  }
}

// Row tiles of 16 per warp in the forward kernel: two where the registers allow, which halves the
// shared-memory reads per product. At head size 32 that takes 173 registers; at 64 it would take all
// 255 and spill (ptxas, sm_90), halving the blocks per SM, so 64 and 128 keep one.
template <int HS>
constexpr int kFwdRowTiles = HS <= 32 ? 2 : 1;
// Query rows per forward block.
template <int HS>
constexpr int kFwdRows = kWarps * 16 * kFwdRowTiles<HS>;

template <class D, int HS>
__global__ void __launch_bounds__(kThreads)
    fwd_kernel(D* out, float* lse, const D* qkv, const int32_t* doc, int T, int C, int NH, float scale_log2) {
  constexpr int LD = kLd<HS>, KS = HS / 16, NT = HS / 8, kElems = kTile * LD;
  constexpr int RT = kFwdRowTiles<HS>, kRows = kFwdRows<HS>;
  MT_DYNAMIC_SHARED(uint4, smem_raw);
  D* Qs = reinterpret_cast<D*>(smem_raw);                 // kRows rows
  D* Ks = Qs + kRows * LD;                                 // key tile i in buffer i % 2
  D* Vs = Ks + 2 * kElems;                                 // likewise
  int* kdoc = reinterpret_cast<int*>(Vs + 2 * kElems);     // 2 x kTile
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kRows;  // the longest rows start first
  const int h = int(blockIdx.y), b = int(blockIdx.z);
  const int r0 = int(threadIdx.x) / kLanes * 16 * RT;     // the warp's first row in the block
  const Lane ln(int(threadIdx.x) % kLanes);
  const int64_t ld = 3 * int64_t(C);
  const D* head = qkv + int64_t(b) * T * ld + int64_t(h) * HS;
  const int32_t* bdoc = doc ? doc + int64_t(b) * T : nullptr;
  const int n_tiles = (min(q0 + kRows, T) - 1) / kTile + 1;  // causal: key tiles past the diagonal are skipped

  // cp.async groups: Q, then one per key tile; tile i + 1 is in flight while tile i is worked on.
  copy_rows_async<HS, kRows>(Qs, head, ld, q0, T);
  async_copy::commit();
  copy_rows_async<HS>(Ks, head + C, ld, 0, T);
  copy_rows_async<HS>(Vs, head + 2 * C, ld, 0, T);
  load_docs(kdoc, bdoc, 0, T);
  async_copy::commit();
  async_copy::wait<1>();  // Q has landed
  __syncthreads();
  uint32_t qf[RT][KS][4];
#pragma unroll
  for (int rt = 0; rt < RT; rt++)
#pragma unroll
    for (int kk = 0; kk < KS; kk++) mma::load_a(qf[rt][kk], Qs, LD, r0 + 16 * rt, kk * 16, ln);
  // This lane's rows: in row tile rt, r = 0 is row g of its 16 and r = 1 is row g + 8.
  int row[RT][2], rdoc[RT][2];
  float m[RT][2], l[RT][2], o[RT][NT][4] = {};
#pragma unroll
  for (int rt = 0; rt < RT; rt++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      row[rt][r] = q0 + r0 + 16 * rt + ln.g + 8 * r;
      rdoc[rt][r] = row[rt][r] < T ? (bdoc ? bdoc[row[rt][r]] : 0) : -1;
      m[rt][r] = -INFINITY;
      l[rt][r] = 0.f;
    }

  for (int i = 0; i < n_tiles; i++) {
    const int k0 = i * kTile, cur = i & 1;
    if (i + 1 < n_tiles) {  // into the buffer of tile i - 1, which every warp is done with
      copy_rows_async<HS>(Ks + (cur ^ 1) * kElems, head + C, ld, k0 + kTile, T);
      copy_rows_async<HS>(Vs + (cur ^ 1) * kElems, head + 2 * C, ld, k0 + kTile, T);
      load_docs(kdoc + (cur ^ 1) * kTile, bdoc, k0 + kTile, T);
    }
    async_copy::commit();
    async_copy::wait<1>();  // tile i has landed
    __syncthreads();
    // A warp whose rows all precede the tile sees none of it (with two row tiles per warp, the warps
    // of the block's first half at its last key tile; never with one).
    if (RT == 1 || k0 <= q0 + r0 + 16 * RT - 1) {
      const D* Kt = Ks + cur * kElems;
      const D* Vt = Vs + cur * kElems;
      const int* tdoc = kdoc + cur * kTile;
      float s[RT][kColTiles][4];
      score_tile<D, KS, LD, RT>(s, qf, Kt, ln);
      // Every key of the tile precedes every row of the warp: no mask to evaluate.
      const bool unmasked = !bdoc && k0 + kTile - 1 <= q0 + r0;
#pragma unroll
      for (int rt = 0; rt < RT; rt++) {
        float mx[2] = {m[rt][0], m[rt][1]};
#pragma unroll
        for (int n = 0; n < kColTiles; n++) {
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int r = e >> 1, jj = n * 8 + 2 * ln.t + (e & 1);
            float v = s[rt][n][e] * scale_log2;
            if (!unmasked && !visible(row[rt][r], k0 + jj, T, rdoc[rt][r], tdoc[jj])) v = -INFINITY;
            s[rt][n][e] = v;
            mx[r] = fmaxf(mx[r], v);
          }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
          mx[r] = quad_max(mx[r]);
          // A row that has seen no key yet has m = -inf, l = 0 and o = 0: its rescale factor is 0.
          alpha[r] = mx[r] == -INFINITY ? 0.f : exp2f(m[rt][r] - mx[r]);
          m[rt][r] = mx[r];
          l[rt][r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < kColTiles; n++) {
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int r = e >> 1;
            const float p = s[rt][n][e] == -INFINITY ? 0.f : exp2f(s[rt][n][e] - m[rt][r]);
            s[rt][n][e] = p;
            l[rt][r] += p;
          }
        }
#pragma unroll
        for (int n = 0; n < NT; n++) {
          o[rt][n][0] *= alpha[0], o[rt][n][1] *= alpha[0];
          o[rt][n][2] *= alpha[1], o[rt][n][3] *= alpha[1];
        }
      }
      accumulate_pv<D, NT, LD, RT>(o, s, Vt, ln);
    }
    __syncthreads();  // every warp is done with buffer cur before tile i + 2 is copied into it
  }

#pragma unroll
  for (int rt = 0; rt < RT; rt++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const float sum = quad_sum(l[rt][r]);
      if (row[rt][r] >= T) continue;
      const float inv = 1.f / sum;  // sum >= 1: every query sees itself
      D* y = out + (int64_t(b) * T + row[rt][r]) * C + int64_t(h) * HS + 2 * ln.t;
#pragma unroll
      for (int n = 0; n < NT; n++) store_pair(y + n * 8, o[rt][n][2 * r] * inv, o[rt][n][2 * r + 1] * inv);
      if (ln.t == 0) lse[(int64_t(b) * NH + h) * T + row[rt][r]] = (m[rt][r] + log2f(sum)) * kLn2;
    }
}

// The start of a backward kernel's pipeline. The block's own two tiles (rows t0 .. t0+63 of src_a and
// src_b) go to buffer 0 of `tiles` and the first streamed tile to buffer 1 (issue(0)), each as one
// cp.async group; once the own tiles land, every warp reads its 16 rows of them into the A fragments
// fa and fb, and a barrier frees buffer 0 for the streamed tile 1.
template <int HS, class D, class Issue>
__device__ inline void start_backward(uint32_t (&fa)[HS / 16][4], uint32_t (&fb)[HS / 16][4], D* tiles,
                                      const D* src_a, int64_t ld_a, const D* src_b, int64_t ld_b, int t0, int T,
                                      int r0, Lane ln, Issue& issue) {
  constexpr int LD = kLd<HS>, kElems = kTile * LD;
  copy_rows_async<HS>(tiles, src_a, ld_a, t0, T);
  copy_rows_async<HS>(tiles + kElems, src_b, ld_b, t0, T);
  async_copy::commit();
  issue(0);
  async_copy::commit();
  async_copy::wait<1>();  // the own tiles have landed
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < HS / 16; kk++) {
    mma::load_a(fa[kk], tiles, LD, r0, kk * 16, ln);
    mma::load_a(fb[kk], tiles + kElems, LD, r0, kk * 16, ln);
  }
  __syncthreads();  // every warp has its fragments: buffer 0 is free
}

// dK, dV of the 64 keys of one block, looping over the query tiles from its diagonal on.
template <class D, int HS>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* dsum, const int32_t* doc,
                int T, int C, int NH, float scale, float scale_log2) {
  constexpr int LD = kLd<HS>, KS = HS / 16, NT = HS / 8, kElems = kTile * LD;
  MT_DYNAMIC_SHARED(uint4, smem_raw);
  // Two buffers of (Q, dO) tiles: buffer 0 first holds K and V, which are read once into fragments.
  D* tiles = reinterpret_cast<D*>(smem_raw);                 // buffer u: Q at 2u, dO at 2u + 1 tiles
  float* lse_s = reinterpret_cast<float*>(tiles + 4 * kElems);  // 2 x kTile, log2 units
  float* dsum_s = lse_s + 2 * kTile;                          // 2 x kTile
  int* qdoc = reinterpret_cast<int*>(dsum_s + 2 * kTile);     // 2 x kTile
  const int k0 = int(blockIdx.x) * kTile;  // the first key blocks see the most queries and start first
  const int h = int(blockIdx.y), b = int(blockIdx.z);
  const int r0 = int(threadIdx.x) / kLanes * 16;
  const Lane ln(int(threadIdx.x) % kLanes);
  const int64_t ld = 3 * int64_t(C);
  const D* head = qkv + int64_t(b) * T * ld + int64_t(h) * HS;
  const D* dhead = dout + int64_t(b) * T * C + int64_t(h) * HS;
  const int64_t stat0 = (int64_t(b) * NH + h) * T;
  const int32_t* bdoc = doc ? doc + int64_t(b) * T : nullptr;
  const int n_tiles = (T - 1 - k0) / kTile + 1;  // causal: queries before the key block see none of it
  // Query tile j (rows k0 + 64 j ..) goes to buffer 1 - j % 2: tile 0 to buffer 1, tile 1 to buffer 0
  // once the K, V fragments are out of it. Its row statistics are loaded (synchronously) alongside.
  auto issue = [&](int j) {
    const int u = 1 - (j & 1), q0 = k0 + j * kTile;
    copy_rows_async<HS>(tiles + 2 * u * kElems, head, ld, q0, T);
    copy_rows_async<HS>(tiles + (2 * u + 1) * kElems, dhead, C, q0, T);
    load_docs(qdoc + u * kTile, bdoc, q0, T);
    for (int r = int(threadIdx.x); r < kTile; r += kThreads) {
      const bool in = q0 + r < T;
      lse_s[u * kTile + r] = in ? lse[stat0 + q0 + r] * kLog2e : 0.f;
      dsum_s[u * kTile + r] = in ? dsum[stat0 + q0 + r] : 0.f;
    }
  };

  // cp.async groups: K and V, then one per query tile; tile j + 1 is in flight while j is worked on.
  uint32_t kf[KS][4], vf[KS][4];
  start_backward<HS>(kf, vf, tiles, head + C, ld, head + 2 * C, ld, k0, T, r0, ln, issue);
  const int key[2] = {k0 + r0 + ln.g, k0 + r0 + ln.g + 8};
  int kd[2];
#pragma unroll
  for (int r = 0; r < 2; r++) kd[r] = key[r] < T ? (bdoc ? bdoc[key[r]] : 0) : -2;  // never a query's id
  float dk[NT][4] = {}, dv[NT][4] = {};

  for (int j = 0; j < n_tiles; j++) {
    const int q0 = k0 + j * kTile, u = 1 - (j & 1);
    if (j + 1 < n_tiles) issue(j + 1);  // into the buffer of tile j - 1 (or K, V), which every warp is done with
    async_copy::commit();
    async_copy::wait<1>();  // tile j has landed
    __syncthreads();
    const D* Qs = tiles + 2 * u * kElems;
    const D* dOs = tiles + (2 * u + 1) * kElems;
    const float* tlse = lse_s + u * kTile;
    const float* tdsum = dsum_s + u * kTile;
    const int* tdoc = qdoc + u * kTile;

    float st[kColTiles][4], dpt[kColTiles][4];  // rows: keys, columns: queries
    score_tile<D, KS, LD>(&st, &kf, Qs, ln);
    score_tile<D, KS, LD>(&dpt, &vf, dOs, ln);
    // Every key of the warp precedes every (real) query of the tile: no mask to evaluate.
    const bool unmasked = !bdoc && k0 + r0 + 15 <= q0 && q0 + kTile <= T;
#pragma unroll
    for (int n = 0; n < kColTiles; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = e >> 1, ii = n * 8 + 2 * ln.t + (e & 1);
        const bool vis = unmasked || visible(q0 + ii, key[r], T, tdoc[ii], kd[r]);
        const float p = vis ? exp2f(st[n][e] * scale_log2 - tlse[ii]) : 0.f;
        st[n][e] = p;
        dpt[n][e] = p * (dpt[n][e] - tdsum[ii]);
      }
    }
    accumulate_pv<D, NT, LD>(&dv, &st, dOs, ln);   // dV += P^T dO
    accumulate_pv<D, NT, LD>(&dk, &dpt, Qs, ln);   // dK += dS^T Q (scaled on store)
    __syncthreads();  // every warp is done with buffer u before tile j + 2 is copied into it
  }

#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (key[r] >= T) continue;
    D* row = dqkv + (int64_t(b) * T + key[r]) * ld + int64_t(h) * HS + 2 * ln.t;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      store_pair(row + C + n * 8, dk[n][2 * r] * scale, dk[n][2 * r + 1] * scale);
      store_pair(row + 2 * C + n * 8, dv[n][2 * r], dv[n][2 * r + 1]);
    }
  }
}

// dQ of the 64 queries of one block, looping over the key tiles up to its diagonal.
template <class D, int HS>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* dsum, const int32_t* doc, int T,
              int C, int NH, float scale, float scale_log2) {
  constexpr int LD = kLd<HS>, KS = HS / 16, NT = HS / 8, kElems = kTile * LD;
  MT_DYNAMIC_SHARED(uint4, smem_raw);
  // Two buffers of (K, V) tiles: buffer 0 first holds Q and dO, which are read once into fragments.
  D* tiles = reinterpret_cast<D*>(smem_raw);             // buffer u: K at 2u, V at 2u + 1 tiles
  int* kdoc = reinterpret_cast<int*>(tiles + 4 * kElems);  // 2 x kTile
  const int q0 = (int(gridDim.x) - 1 - int(blockIdx.x)) * kTile;  // the longest rows start first
  const int h = int(blockIdx.y), b = int(blockIdx.z);
  const int r0 = int(threadIdx.x) / kLanes * 16;
  const Lane ln(int(threadIdx.x) % kLanes);
  const int64_t ld = 3 * int64_t(C);
  const D* head = qkv + int64_t(b) * T * ld + int64_t(h) * HS;
  const int64_t stat0 = (int64_t(b) * NH + h) * T;
  const int32_t* bdoc = doc ? doc + int64_t(b) * T : nullptr;
  const int n_tiles = (min(q0 + kTile, T) - 1) / kTile + 1;  // causal: key tiles past the diagonal are skipped
  // Key tile i goes to buffer 1 - i % 2: tile 0 to buffer 1, tile 1 to buffer 0 once the Q, dO
  // fragments are out of it.
  auto issue = [&](int i) {
    const int u = 1 - (i & 1), k0 = i * kTile;
    copy_rows_async<HS>(tiles + 2 * u * kElems, head + C, ld, k0, T);
    copy_rows_async<HS>(tiles + (2 * u + 1) * kElems, head + 2 * C, ld, k0, T);
    load_docs(kdoc + u * kTile, bdoc, k0, T);
  };

  // cp.async groups: Q and dO, then one per key tile; tile i + 1 is in flight while i is worked on.
  uint32_t qf[KS][4], of[KS][4];
  start_backward<HS>(qf, of, tiles, head, ld, dout + int64_t(b) * T * C + int64_t(h) * HS, C, q0, T, r0, ln, issue);
  const int row[2] = {q0 + r0 + ln.g, q0 + r0 + ln.g + 8};
  int rdoc[2];
  float rlse[2], rdsum[2], dq[NT][4] = {};
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const bool in = row[r] < T;
    rdoc[r] = in ? (bdoc ? bdoc[row[r]] : 0) : -1;
    rlse[r] = in ? lse[stat0 + row[r]] * kLog2e : 0.f;
    rdsum[r] = in ? dsum[stat0 + row[r]] : 0.f;
  }

  for (int i = 0; i < n_tiles; i++) {
    const int k0 = i * kTile, u = 1 - (i & 1);
    if (i + 1 < n_tiles) issue(i + 1);  // into the buffer of tile i - 1 (or Q, dO), which every warp is done with
    async_copy::commit();
    async_copy::wait<1>();  // tile i has landed
    __syncthreads();
    const D* Ks = tiles + 2 * u * kElems;
    const D* Vs = tiles + (2 * u + 1) * kElems;
    const int* tdoc = kdoc + u * kTile;

    float s[kColTiles][4], dp[kColTiles][4];
    score_tile<D, KS, LD>(&s, &qf, Ks, ln);
    score_tile<D, KS, LD>(&dp, &of, Vs, ln);
    const bool unmasked = !bdoc && k0 + kTile - 1 <= q0 + r0;
#pragma unroll
    for (int n = 0; n < kColTiles; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int r = e >> 1, jj = n * 8 + 2 * ln.t + (e & 1);
        const bool vis = unmasked || visible(row[r], k0 + jj, T, rdoc[r], tdoc[jj]);
        const float p = vis ? exp2f(s[n][e] * scale_log2 - rlse[r]) : 0.f;
        s[n][e] = p * (dp[n][e] - rdsum[r]);  // dS
      }
    }
    accumulate_pv<D, NT, LD>(&dq, &s, Ks, ln);  // dQ += dS K (scaled on store)
    __syncthreads();  // every warp is done with buffer u before tile i + 2 is copied into it
  }

#pragma unroll
  for (int r = 0; r < 2; r++) {
    if (row[r] >= T) continue;
    D* y = dqkv + (int64_t(b) * T + row[r]) * ld + int64_t(h) * HS + 2 * ln.t;
#pragma unroll
    for (int n = 0; n < NT; n++) store_pair(y + n * 8, dq[n][2 * r] * scale, dq[n][2 * r + 1] * scale);
  }
}

// Shared bytes of each kernel. Forward: Q (kFwdRows rows) and two buffers of (K, V) tiles, with the keys'
// document ids.
// Backward: two buffers of two tiles (the first starts with the block's own two tiles), with the
// streamed rows' statistics and document ids (dK/dV: lse, dsum, ids; dQ: ids only).
template <class D, int HS>
constexpr size_t fwd_smem() {
  return (size_t(kFwdRows<HS>) + 4 * kTile) * kLd<HS> * sizeof(D) + 2 * kTile * sizeof(int);
}
template <class D, int HS>
constexpr size_t bwd_smem() {
  return size_t(4) * kTile * kLd<HS> * sizeof(D) + 2 * 3 * kTile * sizeof(float);
}

// One block of kThreads per (64-row block, head, batch row) for each kernel.
inline dim3 tile_grid(int B, int T, int NH) { return dim3(ceil_div(T, kTile), unsigned(NH), unsigned(B)); }
template <class D, int HS>
LaunchShape fwd_shape(int B, int T, int NH) {  // a block per kFwdRows<HS> queries
  return {dim3(ceil_div(T, kFwdRows<HS>), unsigned(NH), unsigned(B)), dim3(kThreads), fwd_smem<D, HS>()};
}
template <class D, int HS>
LaunchShape bwd_shape(int B, int T, int NH) {  // dkdv_kernel and dq_kernel
  return {tile_grid(B, T, NH), dim3(kThreads), bwd_smem<D, HS>()};
}

}  // namespace mt::cuda::flash_mma::kernels
