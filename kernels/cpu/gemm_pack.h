// Packing of the built-in GEMM's operands (internal to kernels/cpu; the driver is gemm.cpp).
//
// Both operands are packed as W-wide panels of a kc x width block X (W = MR for A, NR for B):
// panel p holds columns p*W.. of X, its row k is W consecutive values, panels lie kc*W apart, and the
// last panel is zero-padded to W columns. X is stored either row by row (element (k, j) at
// src[k * ld + j]: copy_panels) or column by column (at src[j * ld + k]: transpose_panels). Both walk
// the source along its contiguous dimension, one row (or sixteen columns; four without AVX-512) at a
// time, so the hardware prefetchers follow them; walking a panel at a time would stride through the
// source.
#pragma once

namespace mt::cpu {

// op(B)[k0:k0+kc, j0:j0+nc] as NR-wide panels (row k of a panel = NR consecutive values); op(B) is B
// (row stride ldb) or, with trans, the transpose of B.
template <class T>
void pack_b(T* dst, bool trans, const T* B, int ldb, int k0, int kc, int j0, int nc, int NR);

// op(A)[i0:i0+mc, k0:k0+kc] as MR-row panels (column k of a panel = MR consecutive values).
template <class T>
void pack_a(T* dst, bool trans, const T* A, int lda, int i0, int mc, int k0, int kc, int MR);

}  // namespace mt::cpu
