// GEMM for the CPU backend: a built-in packed, cache-blocked driver with SIMD micro-kernels
// (gemm_kernels.h), and OpenBLAS as the fallback where no SIMD micro-kernel applies (use_blas below).
//
// Threading is OpenMP only. The built-in driver tiles C among the threads, each packing its own
// panels of A and B (gemm_packed). OpenBLAS (pthreads build) keeps its own thread pool next to OpenMP's;
// on a machine with few cores the two pools fight (each spins while the other works, and OpenBLAS
// called inside an OpenMP region serialises on its pool or oversubscribes the cores). So when BLAS is
// used it runs single-threaded (set once, at the first BLAS GEMM) and OpenMP cuts a large GEMM into
// one panel of C per thread; a GEMM issued inside a parallel region (per attention head) runs on the
// calling thread either way. One pool, no nesting, results deterministic for a fixed thread count.
#include "kernels/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <type_traits>

#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/gemm_pack.h"
#include "runtime/check.h"

#ifdef MT_HAVE_BLAS
#include <cblas.h>
#endif

namespace mt::cpu {

namespace {

// Cache blocking of the built-in GEMM (Goto & van de Geijn 2008): for each column block of a thread's
// share of C and each KC-deep slice of k, op(B)[k slice, column block] is packed into NR-wide panels
// sized to stay in L2 (kBlockBytes); the thread then takes MC-row blocks of its share, packs
// op(A)[rows, k slice] into MR-row panels, and runs each MR x kc panel of A (12 KiB for AVX-512
// floats, held in L1) across every panel of the block of B, which streams from L2 while C is written
// row by row. The other way round (a kc x NR panel of B held in L1 while the MC x KC block of A
// streamed from L2, and 4096 columns a block: a 4 MB slice of B that spilled out of L2) measured
// 10-20% slower on the 2-core AVX-512 machine for every product of a GPT-2 step (docs/perf.md,
// issue 32's seventh pass), and needed three-times-deeper slices for the classifier's products to
// limit their passes over a large C; this order does best with one slice depth everywhere.
constexpr int KC = 256;
// A packed block of B: half of a 2 MiB L2, all of Zen 4's 1 MiB (where 384 and 512 KiB blocks, with A
// packed once per k slice instead of once per block, measured no faster: docs/perf.md, tenth pass).
constexpr size_t kBlockBytes = size_t(1) << 20;

int slice_depth(int K) {
  return std::min(KC, std::max(K, 1));
}

// Columns per block of B: equal widths, a multiple of NR, each block's kc x width panels within
// kBlockBytes (at least one panel).
template <class T>
int block_width(int columns, int kc, int NR) {
  const int fit = std::max(NR, int(kBlockBytes / (size_t(kc) * sizeof(T))) / NR * NR);
  const int blocks = (columns + fit - 1) / fit;
  return ((columns + blocks - 1) / blocks + NR - 1) / NR * NR;
}
constexpr int kRowsPerBlock = 192;  // MC is the multiple of MR nearest below this
constexpr int kDirectPanels = 4;    // up to this many NR-wide column panels, A is not packed

template <class T>
const MicroKernel<T>& micro_kernel();
template <>
const MicroKernel<float>& micro_kernel<float>() {
  return float_micro_kernel();
}
template <>
const MicroKernel<double>& micro_kernel<double>() {
  return double_micro_kernel();
}

template <class T>
AlignedBuffer<T> aligned_buffer(size_t n) {
  AlignedBuffer<T> b;
  b.reserve(n);
  return b;
}

// Rows ic..ic+mc of C, columns jc..jc+nc, take one kc-deep slice of the product: op(A)[rows, pc..pc+kc]
// times a packed slice of op(B) whose NR-wide panel jp starts at b + jp * bstride (row k of a panel =
// NR values). first: this is the first slice, so C is scaled by beta instead of accumulated. A is
// packed into apack (or read in place when direct_a); edge holds one MR x NR block for ragged edges.
template <class T>
void multiply_block(const MicroKernel<T>& uk, bool trans_a, bool direct_a, const T* A, int lda, int ic, int mc, int pc,
                    int kc, const T* b, size_t bstride, int jc, int nc, T alpha, T beta, bool first, T* C, int ldc,
                    T* apack, T* edge) {
  const int MR = uk.mr, NR = uk.nr, full = mc / MR * MR, panels = (nc + NR - 1) / NR;
  if (!direct_a)
    pack_a(apack, trans_a, A, lda, ic, mc, pc, kc, MR);
  else if (full < mc)  // only the ragged last panel needs zero padding
    pack_a(apack + size_t(full) * kc, trans_a, A, lda, ic + full, mc - full, pc, kc, MR);
  for (int ir = 0; ir < mc; ir += MR) {
    const int mr = std::min(MR, mc - ir);
    const T* ap = apack + size_t(ir) * kc;
    int64_t rs = 1, ks = MR;
    if (direct_a && ir < full) {
      const int64_t i = ic + ir;
      ap = trans_a ? A + int64_t(pc) * lda + i : A + i * lda + pc;
      rs = trans_a ? 1 : lda;
      ks = trans_a ? lda : 1;
    }
    for (int jp = 0; jp < panels; jp++) {
      const int nr = std::min(NR, nc - jp * NR);
      const T* bp = b + size_t(jp) * bstride;
      T* c = C + size_t(ic + ir) * size_t(ldc) + size_t(jc + jp * NR);
      if (mr == MR && nr == NR) {
        uk.run(kc, ap, rs, ks, bp, c, ldc, alpha, beta, first);
        continue;
      }
      // Ragged edge: full block into scratch, then the same update on the valid part.
      uk.run(kc, ap, rs, ks, bp, edge, NR, T(1), T(0), true);
      for (int r = 0; r < mr; r++) {
        T* cr = c + size_t(r) * size_t(ldc);
        for (int j = 0; j < nr; j++) {
          const T base = first ? (beta == T(0) ? T(0) : beta * cr[j]) : cr[j];
          cr[j] = base + alpha * edge[size_t(r) * NR + size_t(j)];
        }
      }
    }
  }
}

#ifdef MT_HAVE_BLAS
void blas_single_threaded() {
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
}

void blas_call(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
               float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}
void blas_call(bool ta, bool tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B, int ldb,
               double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}
#endif

}  // namespace

template <class T>
T* AlignedBuffer<T>::reserve(size_t n) {
  if (n <= n_ && p_) return p_.get();
  const size_t bytes = (std::max<size_t>(n, 1) * sizeof(T) + 63) / 64 * 64;
  p_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
  MT_CHECK(p_ != nullptr, "out of memory for a %zu-byte GEMM packing buffer", bytes);
  n_ = bytes / sizeof(T);
  return p_.get();
}

template <class T>
void PackedB<T>::pack(bool trans, const T* B, int ldb, int K, int N) {
  const int NR = micro_kernel<T>().nr, panels = (N + NR - 1) / NR;
  K_ = K;
  N_ = N;
  nr_ = NR;
  T* dst = buf_.reserve(size_t(panels) * size_t(NR) * size_t(std::max(K, 1)));
  pack_b(dst, trans, B, ldb, 0, K, 0, N, NR);
}

template <class T>
void gemm_prepacked(bool trans_a, int M, int N, int K, T alpha, const T* A, int lda, const PackedB<T>& B, int k0,
                    T beta, T* C, int ldc, GemmScratch<T>& scratch) {
  const MicroKernel<T>& uk = micro_kernel<T>();
  MT_CHECK(N <= B.cols() && k0 >= 0 && k0 + K <= B.rows(),
           "gemm_prepacked: columns 0..%d and rows %d..%d are outside the packed %d x %d operand", N, k0, k0 + K,
           B.rows(), B.cols());
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    gemm_packed(uk, trans_a, false, M, N, 0, alpha, A, lda, static_cast<const T*>(nullptr), 0, beta, C, ldc);
    return;
  }
  const int MR = uk.mr, NR = uk.nr, MC = std::max(1, kRowsPerBlock / MR) * MR;
  const int KS = slice_depth(K);
  T* apack = scratch.apack.reserve(size_t(std::min(MC, (M + MR - 1) / MR * MR)) * size_t(KS));
  T* edge = scratch.edge.reserve(size_t(MR) * size_t(NR));
  const bool direct_a = (N + NR - 1) / NR <= kDirectPanels;
  const int nc_max = block_width<T>(N, KS, NR);
  for (int jc = 0; jc < N; jc += nc_max)
    for (int pc = 0; pc < K; pc += KS) {
      const int kc = std::min(KS, K - pc);
      for (int ic = 0; ic < M; ic += MC)
        multiply_block(uk, trans_a, direct_a, A, lda, ic, std::min(MC, M - ic), pc, kc, B.at(jc / NR, k0 + pc),
                       size_t(B.rows()) * NR, jc, std::min(nc_max, N - jc), alpha, beta, pc == 0, C, ldc, apack,
                       edge);
    }
}

template <class T>
void gemm_builtin(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
                  T beta, T* C, int ldc) {
  gemm_packed(micro_kernel<T>(), trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace {

// One thread's block of C = alpha op(A) op(B) + beta C: rows i0..i1 and columns j0..j1, every k slice
// in order, with the thread's own packed panels of A and B.
template <class T>
void multiply_range(const MicroKernel<T>& uk, bool trans_a, bool trans_b, bool direct_a, int KS, int i0, int i1,
                    int j0, int j1, int K, T alpha, const T* A, int lda, const T* B, int ldb, T beta, T* C, int ldc) {
  if (i0 >= i1 || j0 >= j1) return;
  const int MR = uk.mr, NR = uk.nr, MC = std::max(1, kRowsPerBlock / MR) * MR;
  const int nc_max = block_width<T>(j1 - j0, KS, NR);  // A is packed once per column block
  auto bpack = aligned_buffer<T>(size_t(nc_max) * size_t(KS));
  auto apack = aligned_buffer<T>(size_t(std::min(MC, (i1 - i0 + MR - 1) / MR * MR)) * size_t(KS));
  auto edge = aligned_buffer<T>(size_t(MR) * size_t(NR));
  for (int jc = j0; jc < j1; jc += nc_max) {
    const int nc = std::min(nc_max, j1 - jc);
    for (int pc = 0; pc < K; pc += KS) {
      const int kc = std::min(KS, K - pc);
      pack_b(bpack.get(), trans_b, B, ldb, pc, kc, jc, nc, NR);
      for (int ic = i0; ic < i1; ic += MC)
        multiply_block(uk, trans_a, direct_a, A, lda, ic, std::min(MC, i1 - ic), pc, kc, bpack.get(), size_t(NR) * kc,
                       jc, nc, alpha, beta, pc == 0, C, ldc, apack.get(), edge.get());
    }
  }
}

// How nth threads tile C: rows x cols = nth blocks. A thread packs its rows of A for each of its
// column blocks and its columns of B for each of its row blocks, so a tiling packs A cols times and B
// rows times over: the tiling with the least of that packing wins (for two threads: split the longer
// side of C), among those that give every thread at least one MR x NR panel.
struct Tiling {
  int rows = 1, cols = 1;
};
Tiling tile_threads(int nth, int M, int N, int MR, int NR) {
  Tiling best;
  double best_cost = -1;
  for (int r = 1; r <= nth; r++) {
    if (nth % r) continue;
    const int c = nth / r;
    if (r > (M + MR - 1) / MR || c > (N + NR - 1) / NR) continue;
    const double cost = double(c) * M + double(r) * N;  // values packed, per unit of k
    if (best_cost < 0 || cost < best_cost) best = {r, c}, best_cost = cost;
  }
  return best;
}

}  // namespace

template <class T>
void gemm_packed(const MicroKernel<T>& uk, bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A,
                 int lda, const T* B, int ldb, T beta, T* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // op(A) @ op(B) is empty: C = beta C
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        T& c = C[size_t(i) * size_t(ldc) + size_t(j)];
        c = beta == T(0) ? T(0) : beta * c;
      }
    return;
  }
  const int MR = uk.mr, NR = uk.nr, KS = slice_depth(K);
  // With only a few column panels each element of A is used by few micro-kernel calls, and packing
  // A would cost as much as the product (e.g. attention's P @ V with 64 columns): the micro-kernel
  // then reads op(A) in place.
  const bool direct_a = (N + NR - 1) / NR <= kDirectPanels;
  // Each thread owns a block of C and packs its own operands: no thread waits for another's packing,
  // and the only synchronisation is the end of the region. Before, the threads shared each packed
  // slice of B, which cost two barriers per slice (the slower thread's stalls on cold memory became
  // everyone's). Every element of C still sums its k slices in order inside one micro-kernel call per
  // slice, whichever thread runs it, so the result is independent of the number of threads.
  const bool parallel = !omp_in_parallel() && 2.0 * M * N * K >= 4e6;
#pragma omp parallel if (parallel)
  {
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    const Tiling t = tile_threads(nth, M, N, MR, NR);
    if (tid < t.rows * t.cols) {
      const int rb = tid / t.cols, cb = tid % t.cols;
      const int panels_m = (M + MR - 1) / MR, panels_n = (N + NR - 1) / NR;
      const int i0 = int(int64_t(panels_m) * rb / t.rows) * MR, i1 = int(int64_t(panels_m) * (rb + 1) / t.rows) * MR;
      const int j0 = int(int64_t(panels_n) * cb / t.cols) * NR, j1 = int(int64_t(panels_n) * (cb + 1) / t.cols) * NR;
      multiply_range(uk, trans_a, trans_b, direct_a, KS, i0, std::min(i1, M), j0, std::min(j1, N), K, alpha, A, lda, B,
                     ldb, beta, C, ldc);
    }
  }
}

namespace {

// gemm()'s choice of path, fixed per process and type. The built-in kernel is used whenever it has a
// SIMD micro-kernel for this CPU. Measured on the 2-core development machine (Xeon with AVX-512),
// one thread, N=1024 IC=768 OC=2304: built-in ~135 GF/s; Debian's OpenBLAS 0.3.21 ~30 GF/s, because
// it does not recognise that CPU model and falls back to its SSE3 kernels (forced to its SkylakeX
// kernels it reaches ~150 GF/s). The built-in path is also independent of the thread count. BLAS
// remains the path on CPUs without a SIMD micro-kernel, and for double (used by the tests).
template <class T>
bool use_blas() {
#ifdef MT_HAVE_BLAS
  if constexpr (std::is_same_v<T, float>) return std::string_view(float_micro_kernel().name) == "portable";
  return true;
#else
  return false;
#endif
}

#ifdef MT_HAVE_BLAS
template <class T>
void gemm_blas(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb,
               T beta, T* C, int ldc) {
  blas_single_threaded();
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  // Below ~4 MFLOP a second thread costs more to wake than it saves.
  if (nt == 1 || 2.0 * M * N * K < 4e6) {
    blas_call(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const bool split_rows = M >= N;
  const int extent = split_rows ? M : N;
  // Panel boundaries on multiples of 16 keep every panel but the last on BLAS's full-width kernels.
  const int chunk = ((extent + nt - 1) / nt + 15) / 16 * 16;
  const int panels = (extent + chunk - 1) / chunk;
#pragma omp parallel for num_threads(nt) schedule(static, 1)
  for (int p = 0; p < panels; p++) {
    int s = p * chunk, n = std::min(chunk, extent - s);
    if (split_rows) {
      const T* a = trans_a ? A + s : A + size_t(s) * size_t(lda);
      blas_call(trans_a, trans_b, n, N, K, alpha, a, lda, B, ldb, beta, C + size_t(s) * size_t(ldc), ldc);
    } else {
      const T* b = trans_b ? B + size_t(s) * size_t(ldb) : B + s;
      blas_call(trans_a, trans_b, M, n, K, alpha, A, lda, b, ldb, beta, C + s, ldc);
    }
  }
}
#endif

}  // namespace

template <class T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B, int ldb, T beta,
          T* C, int ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef MT_HAVE_BLAS
  static const bool blas = use_blas<T>();
  if (blas) {
    gemm_blas(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#endif
  gemm_builtin(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool have_blas() {
#ifdef MT_HAVE_BLAS
  return true;
#else
  return false;
#endif
}

const char* gemm_backend(bool for_double) {
  if (for_double ? use_blas<double>() : use_blas<float>()) return "OpenBLAS";
  return for_double ? double_micro_kernel().name : float_micro_kernel().name;
}

template void gemm<float>(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*, int);
template void gemm<double>(bool, bool, int, int, int, double, const double*, int, const double*, int, double, double*,
                           int);
template void gemm_builtin<float>(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*,
                                  int);
template void gemm_builtin<double>(bool, bool, int, int, int, double, const double*, int, const double*, int, double,
                                   double*, int);
template void gemm_packed<float>(const MicroKernel<float>&, bool, bool, int, int, int, float, const float*, int,
                                 const float*, int, float, float*, int);
template class AlignedBuffer<float>;
template class AlignedBuffer<double>;
template class PackedB<float>;
template class PackedB<double>;
template void gemm_prepacked<float>(bool, int, int, int, float, const float*, int, const PackedB<float>&, int, float,
                                    float*, int, GemmScratch<float>&);
template void gemm_prepacked<double>(bool, int, int, int, double, const double*, int, const PackedB<double>&, int,
                                     double, double*, int, GemmScratch<double>&);
template void gemm_packed<double>(const MicroKernel<double>&, bool, bool, int, int, int, double, const double*, int,
                                  const double*, int, double, double*, int);

}  // namespace mt::cpu
