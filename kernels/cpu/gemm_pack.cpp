// Packing of the built-in GEMM's operands (gemm_pack.h). On AVX-512 the panels are moved by whole
// cache lines: 16 x 16 register transposes and 16-row copies a panel at a time (docs/perf.md, issue
// 32's fifth pass); elsewhere by SSE 4 x 4 transposes and row copies. Every path moves the same
// values to the same places, so the products' bits never depend on which one ran.
#include "kernels/cpu/gemm_pack.h"

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "kernels/cpu/vec_math.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MT_PACK_AVX512 1
#endif

namespace mt::cpu {

namespace {

#ifdef MT_PACK_AVX512
// Up to sixteen source columns (`cols` rows of the stored matrix, ld apart) by sixteen k: loaded as
// rows of 16 values (whole cache lines, up to sixteen streams in flight), transposed in registers,
// stored as 16 panel rows of `cols` values (W apart; masked when cols < 16: A's 12-row panels).
// Where the 4 x 4 SSE transposes packed an expert's 768 x 3072 weight at 10-12 GB/s over two
// threads, this packs it at 15 (docs/perf.md).
// GCC 12's AVX-512 shuffle intrinsics start from _mm512_undefined_ps(), which it then flags.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void transpose16(float* d, int W, const float* s, int ld, int kc, int cols) {
  const __mmask16 keep = __mmask16((1u << cols) - 1u);
  for (int k = 0; k + 16 <= kc; k += 16) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++)
      r[i] = i < cols ? _mm512_loadu_ps(s + size_t(i) * size_t(ld) + k) : _mm512_setzero_ps();
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
      r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
      r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
      t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
      t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
      t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
      t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
    }
    float* o = d + size_t(k) * W;
    for (int c = 0; c < 8; c++) {
      _mm512_mask_storeu_ps(o + size_t(c) * W, keep, _mm512_shuffle_f32x4(t[c], t[c + 8], 0x88));
      _mm512_mask_storeu_ps(o + size_t(c + 8) * W, keep, _mm512_shuffle_f32x4(t[c], t[c + 8], 0xDD));
    }
  }
}
#pragma GCC diagnostic pop

// Rows k0..k0+rows of every whole panel: W values (W a multiple of 16, or under 16, masked) per
// panel row, whole zmm loads and stores, a panel at a time so that its rows are written as one
// contiguous run (row by row across all panels, each row's stores landed 32 KiB apart, on the same
// few L1 sets). An expert's 3072 x 768 weight packs at 30-37 GB/s over two threads (L3-resident),
// against 13-16 for the SSE row loop and 19-22 for this one a row at a time.
constexpr int kCopyRows = 16;
__attribute__((target("avx512f"))) void copy_rows16(float* dst, const float* src, int ld, int k0, int rows, int full,
                                                    int W, int kc) {
  const __mmask16 keep = __mmask16(W >= 16 ? 0xFFFFu : (1u << W) - 1u);
  for (int j = 0; j < full; j += W) {
    float* p = dst + size_t(j) * size_t(kc) + size_t(k0) * size_t(W);
    const float* s = src + size_t(k0) * size_t(ld) + size_t(j);
    for (int k = 0; k < rows; k++)
      for (int r = 0; r < W; r += 16)
        _mm512_mask_storeu_ps(p + size_t(k) * size_t(W) + r, keep,
                              _mm512_maskz_loadu_ps(keep, s + size_t(k) * size_t(ld) + r));
  }
}
#endif

// Columns j0.. of X (the last panel zero-padded), row by row.
template <class T>
void copy_panels_from(T* dst, const T* src, int ld, int kc, int j0, int width, int W) {
  for (int k = 0; k < kc; k++) {
    const T* row = src + size_t(k) * size_t(ld);
    T* d = dst + size_t(k) * W;
    for (int j = j0; j < width; j += W) {
      T* p = d + size_t(j) * size_t(kc);
      const int w = std::min(W, width - j);
      for (int r = 0; r < w; r++) p[r] = row[j + r];
      for (int r = w; r < W; r++) p[r] = T(0);
    }
  }
}

template <class T>
void copy_panels(T* dst, const T* src, int ld, int kc, int width, int W) {
  const int full = width / W * W;
#ifdef MT_PACK_AVX512
  if constexpr (std::is_same_v<T, float>)
    if ((W % 16 == 0 || W < 16) && cpu_has_avx512()) {
      for (int k0 = 0; k0 < kc; k0 += kCopyRows) copy_rows16(dst, src, ld, k0, std::min(kCopyRows, kc - k0), full, W, kc);
      copy_panels_from(dst, src, ld, kc, full, width, W);  // the ragged last panel, if any
      return;
    }
#endif
#if defined(__SSE__)
  if constexpr (std::is_same_v<T, float>)
    if (W % 4 == 0) {
      for (int k = 0; k < kc; k++) {
        const T* row = src + size_t(k) * size_t(ld);
        T* d = dst + size_t(k) * W;
        for (int j = 0; j < full; j += W)
          for (int r = 0; r < W; r += 4) _mm_storeu_ps(d + size_t(j) * size_t(kc) + r, _mm_loadu_ps(row + j + r));
      }
      copy_panels_from(dst, src, ld, kc, full, width, W);
      return;
    }
#endif
  copy_panels_from(dst, src, ld, kc, 0, width, W);
}

template <class T>
void transpose_panels(T* dst, const T* src, int ld, int kc, int width, int W) {
  for (int j0 = 0; j0 < width; j0 += W) {
    T* p = dst + size_t(j0) * size_t(kc);
    const int w = std::min(W, width - j0);
    const T* col = src + size_t(j0) * size_t(ld);
    int k = 0;
#if defined(__SSE__)
    if constexpr (std::is_same_v<T, float>) {
#ifdef MT_PACK_AVX512
      if (w == W && (W % 16 == 0 || W < 16) && kc >= 16 && cpu_has_avx512()) {
        for (int j = 0; j < W; j += 16) transpose16(p + j, W, col + size_t(j) * size_t(ld), ld, kc, std::min(16, W - j));
        k = kc / 16 * 16;
      } else
#endif
      // Four columns by four k at a time through a 4 x 4 register transpose.
      if (w == W && W % 4 == 0) {
        for (int j = 0; j < W; j += 4) {
          const float* c0 = col + size_t(j) * size_t(ld);
          for (k = 0; k + 4 <= kc; k += 4) {
            __m128 r0 = _mm_loadu_ps(c0 + k), r1 = _mm_loadu_ps(c0 + ld + k), r2 = _mm_loadu_ps(c0 + 2 * size_t(ld) + k),
                   r3 = _mm_loadu_ps(c0 + 3 * size_t(ld) + k);
            _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
            float* d = p + size_t(k) * W + j;
            _mm_storeu_ps(d, r0);
            _mm_storeu_ps(d + W, r1);
            _mm_storeu_ps(d + 2 * W, r2);
            _mm_storeu_ps(d + 3 * W, r3);
          }
        }
      }
    }
#endif
    // Blocks of 8 k: each source column gives 8 contiguous values; the block's rows stay in L1.
    for (; k + 8 <= kc; k += 8)
      for (int j = 0; j < W; j++) {
        const T* c = col + size_t(std::min(j, w - 1)) * size_t(ld) + k;
        const bool real = j < w;
        for (int kk = 0; kk < 8; kk++) p[size_t(k + kk) * W + j] = real ? c[kk] : T(0);
      }
    for (; k < kc; k++)
      for (int j = 0; j < W; j++) p[size_t(k) * W + j] = j < w ? col[size_t(j) * size_t(ld) + k] : T(0);
  }
}

}  // namespace

// op(B)[k0:k0+kc, j0:j0+nc] as NR-wide panels (row k of a panel = NR consecutive values).
template <class T>
void pack_b(T* dst, bool trans, const T* B, int ldb, int k0, int kc, int j0, int nc, int NR) {
  if (trans)
    transpose_panels(dst, B + size_t(j0) * size_t(ldb) + size_t(k0), ldb, kc, nc, NR);
  else
    copy_panels(dst, B + size_t(k0) * size_t(ldb) + size_t(j0), ldb, kc, nc, NR);
}

// op(A)[i0:i0+mc, k0:k0+kc] as MR-row panels (column k of a panel = MR consecutive values): the
// panels of op(A)'s transpose, which is A read with the other transpose flag.
template <class T>
void pack_a(T* dst, bool trans, const T* A, int lda, int i0, int mc, int k0, int kc, int MR) {
  pack_b(dst, !trans, A, lda, k0, kc, i0, mc, MR);
}

template void pack_b<float>(float*, bool, const float*, int, int, int, int, int, int);
template void pack_b<double>(double*, bool, const double*, int, int, int, int, int, int);
template void pack_a<float>(float*, bool, const float*, int, int, int, int, int, int);
template void pack_a<double>(double*, bool, const double*, int, int, int, int, int, int);

}  // namespace mt::cpu
