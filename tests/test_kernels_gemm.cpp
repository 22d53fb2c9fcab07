// The GEMM under every CPU matmul: gemm() (whichever path it takes on this machine, see
// gemm_backend()) and gemm_builtin() against a plain triple loop in long double, for all four transpose combinations,
// alpha/beta, leading dimensions wider than the matrices, and sizes that cross the built-in kernel's register and cache
// blocks (MR up to 12, NR up to 32, MC 192, KC 256 over many slices of a long k, blocks of B 1 MiB wide) with
// ragged edges.
//
// Tolerance, with entries uniform in (-1, 1) and u the unit roundoff of the type:
// |error| <= 2 u (K |alpha| + |beta|). Rounding errors of a length-K sum grow like a random walk, about
// u K / 15 at the worst of the ~1e5 entries checked, so this leaves a wide margin, while a wrong
// index or a missed block gives errors of order 1.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_kernels.h"
#include "runtime/check.h"
#include "tests/test_util.h"

namespace mt::cpu {
namespace {

constexpr size_t sz(int64_t n) { return static_cast<size_t>(n); }

struct Case {
  int M, N, K;
  bool ta, tb;
};

template <class T>
struct Problem {
  int M, N, K, lda, ldb, ldc;
  bool ta, tb;
  T alpha, beta;
  std::vector<T> A, B, C0;

  Problem(const Case& c, std::mt19937_64& rng, T alpha_, T beta_)
      : M(c.M), N(c.N), K(c.K), ta(c.ta), tb(c.tb), alpha(alpha_), beta(beta_) {
    // Stored shapes: A is (M,K) or (K,M); B is (K,N) or (N,K); each row padded by 3 elements.
    const int arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
    lda = acols + 3;
    ldb = bcols + 3;
    ldc = N + 3;
    A = fill(sz(arows) * lda, rng);
    B = fill(sz(brows) * ldb, rng);
    C0 = fill(sz(M) * ldc, rng);
  }
  static std::vector<T> fill(size_t n, std::mt19937_64& rng) {
    std::uniform_real_distribution<double> d(-1, 1);
    std::vector<T> v(n);
    for (auto& x : v) x = T(d(rng));
    return v;
  }
  T a(int i, int k) const { return ta ? A[sz(k) * lda + sz(i)] : A[sz(i) * lda + sz(k)]; }
  T b(int k, int j) const { return tb ? B[sz(j) * ldb + sz(k)] : B[sz(k) * ldb + sz(j)]; }

  // Checks C (computed from C0) against the long-double reference; padding columns must be untouched.
  void check(const std::vector<T>& C, const char* what) const {
    const double u = std::numeric_limits<T>::epsilon();
    const double bound = 2 * u * (K * std::fabs(double(alpha)) + std::fabs(double(beta))) + 1e-300;
    double worst = 0;
    for (int i = 0; i < M; i++) {
      for (int j = 0; j < N; j++) {
        long double s = 0;
        for (int k = 0; k < K; k++) s += (long double)a(i, k) * (long double)b(k, j);
        const long double ref = (long double)alpha * s + (long double)beta * C0[sz(i) * ldc + sz(j)];
        worst = std::max(worst, double(std::fabs((long double)C[sz(i) * ldc + sz(j)] - ref)));
      }
      for (int j = N; j < ldc; j++) ASSERT_EQ(C[sz(i) * ldc + sz(j)], C0[sz(i) * ldc + sz(j)]) << what;
    }
    EXPECT_LE(worst, bound) << what << " M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb;
  }
};

const Case kCases[] = {{1, 1, 1, false, false},     {3, 5, 7, false, true},      {3, 5, 7, true, false},
                       {13, 11, 17, true, true},    {67, 9, 5, false, true},     {5, 263, 3, true, false},
                       {70, 300, 301, false, true}, {130, 257, 300, true, true}, {129, 31, 520, false, false},
                       {401, 45, 33, true, false},  {3, 4133, 19, false, true},
                       // Several blocks of B a slice (kBlockBytes: 1024 floats or 512 doubles wide at
                       // k 256), with ragged edges
                       {29, 2100, 300, false, true}, {27, 1100, 270, true, false},
                       // k over many slices, with a ragged last one
                       {14, 37, 16411, false, true}, {13, 40, 16500, true, false}};

template <class T>
void check_all_cases(std::mt19937_64& rng) {
  for (const Case& c : kCases) {
    for (auto [alpha, beta] : {std::pair<T, T>{T(1), T(0)}, {T(0.75), T(1)}, {T(-1.5), T(0.5)}}) {
      Problem<T> p(c, rng, alpha, beta);
      std::vector<T> blas = p.C0, builtin = p.C0;
      gemm<T>(p.ta, p.tb, p.M, p.N, p.K, alpha, p.A.data(), p.lda, p.B.data(), p.ldb, beta, blas.data(), p.ldc);
      gemm_builtin<T>(p.ta, p.tb, p.M, p.N, p.K, alpha, p.A.data(), p.lda, p.B.data(), p.ldb, beta, builtin.data(),
                      p.ldc);
      p.check(blas, gemm_backend(std::is_same_v<T, double>));
      p.check(builtin, "gemm_builtin");
      if constexpr (std::is_same_v<T, float>) {
        // Every micro-kernel this CPU can run, not only the one gemm_builtin picked.
        for (const auto& uk : runnable_float_micro_kernels()) {
          std::vector<T> c = p.C0;
          gemm_packed<T>(uk, p.ta, p.tb, p.M, p.N, p.K, alpha, p.A.data(), p.lda, p.B.data(), p.ldb, beta, c.data(),
                         p.ldc);
          p.check(c, uk.name);
        }
      }
    }
  }
}

TEST(Gemm, FloatBlasAndBuiltinMatchExactProducts) {
  std::printf("gemm backend: float %s, double %s\n", gemm_backend(false), gemm_backend(true));
  std::mt19937_64 rng(mt::testing::test_seed());
  check_all_cases<float>(rng);
}

TEST(Gemm, DoubleBlasAndBuiltinMatchExactProducts) {
  std::mt19937_64 rng(mt::testing::test_seed() + 1);
  check_all_cases<double>(rng);
}

TEST(Gemm, BetaZeroOverwritesWithoutReadingC) {
  std::mt19937_64 rng(mt::testing::test_seed() + 2);
  Problem<float> p({37, 45, 29, false, true}, rng, 1.f, 0.f);
  std::vector<float> c1(p.C0.size(), std::numeric_limits<float>::quiet_NaN()), c2 = c1;
  gemm<float>(p.ta, p.tb, p.M, p.N, p.K, 1.f, p.A.data(), p.lda, p.B.data(), p.ldb, 0.f, c1.data(), p.ldc);
  gemm_builtin<float>(p.ta, p.tb, p.M, p.N, p.K, 1.f, p.A.data(), p.lda, p.B.data(), p.ldb, 0.f, c2.data(), p.ldc);
  for (int i = 0; i < p.M; i++)
    for (int j = 0; j < p.N; j++) {
      ASSERT_FALSE(std::isnan(c1[sz(i) * p.ldc + sz(j)]));
      ASSERT_FALSE(std::isnan(c2[sz(i) * p.ldc + sz(j)]));
    }
}

TEST(Gemm, BuiltinIsBitwiseIndependentOfThreadCountAndGemmIsRepeatable) {
  std::mt19937_64 rng(mt::testing::test_seed() + 3);
  const int saved = omp_get_max_threads();
  // Threads tile C by rows (M > N), by columns (N > M) or both (4 and 6 threads), with ragged tiles.
  for (const Case& c : {Case{200, 300, 280, true, false}, Case{300, 70, 280, false, true},
                        Case{50, 700, 140, false, false}, Case{130, 257, 300, true, true},
                        Case{40, 2200, 300, false, true}}) {
    Problem<float> p(c, rng, 1.f, 1.f);
    auto run = [&](bool builtin, int threads) {
      omp_set_num_threads(threads);
      std::vector<float> out = p.C0;
      if (builtin)
        gemm_builtin<float>(p.ta, p.tb, p.M, p.N, p.K, 1.f, p.A.data(), p.lda, p.B.data(), p.ldb, 1.f, out.data(),
                            p.ldc);
      else
        gemm<float>(p.ta, p.tb, p.M, p.N, p.K, 1.f, p.A.data(), p.lda, p.B.data(), p.ldb, 1.f, out.data(), p.ldc);
      return out;
    };
    const std::vector<float> one = run(true, 1);
    p.check(one, "gemm_builtin, 1 thread");
    for (int threads : {2, 3, 4, 6}) EXPECT_EQ(one, run(true, threads)) << threads << " threads, M=" << c.M;
    EXPECT_EQ(run(false, 2), run(false, 2));
  }
  omp_set_num_threads(saved);
}

// gemm_prepacked: B packed once, multiplied by blocks of A's rows against a window of B's rows (as
// attention does per head); the bits are gemm_builtin's on the same window, and it is exact.
template <class T>
void check_prepacked(std::mt19937_64& rng) {
  const Case shapes[] = {{1, 1, 1, false, false},    {7, 5, 3, false, true},     {48, 64, 256, false, true},
                         {48, 64, 256, true, false}, {29, 301, 270, true, true}, {200, 33, 520, false, false},
                         {13, 35, 16700, false, true}, {20, 1100, 300, false, true}};
  PackedB<T> packed;  // reused across shapes, as a thread's buffers are
  GemmScratch<T> ws;
  for (const Case& c : shapes) {
    for (const int k0 : {0, 1, c.K / 3}) {
      Problem<T> p(c, rng, T(0.75), T(0.5));
      packed.pack(p.tb, p.B.data(), p.ldb, p.K, p.N);
      ASSERT_EQ(packed.rows(), p.K);
      ASSERT_EQ(packed.cols(), p.N);
      const int K = p.K - k0;
      std::vector<T> got = p.C0, want = p.C0;
      gemm_prepacked<T>(p.ta, p.M, p.N, K, p.alpha, p.A.data(), p.lda, packed, k0, p.beta, got.data(), p.ldc, ws);
      // The same window of B for gemm_builtin: rows k0.. of op(B).
      const T* b = p.tb ? p.B.data() + k0 : p.B.data() + sz(k0) * sz(p.ldb);
      gemm_builtin<T>(p.ta, p.tb, p.M, p.N, K, p.alpha, p.A.data(), p.lda, b, p.ldb, p.beta, want.data(), p.ldc);
      ASSERT_EQ(got, want) << "M=" << c.M << " N=" << c.N << " K=" << c.K << " k0=" << k0 << " ta=" << c.ta;
      if (k0 == 0) p.check(got, "gemm_prepacked");
    }
  }
  // A window outside the packed operand is refused, naming it.
  Problem<T> p({4, 6, 8, false, false}, rng, T(1), T(0));
  packed.pack(false, p.B.data(), p.ldb, p.K, p.N);
  std::vector<T> c = p.C0;
  EXPECT_THROW(gemm_prepacked<T>(false, p.M, p.N, 5, T(1), p.A.data(), p.lda, packed, 4, T(0), c.data(), p.ldc, ws),
               Error);
  EXPECT_THROW(gemm_prepacked<T>(false, p.M, p.N + 1, 8, T(1), p.A.data(), p.lda, packed, 0, T(0), c.data(), p.ldc, ws),
               Error);
}

TEST(Gemm, PrepackedIsBitwiseTheBuiltinOnTheSameRowsOfB) {
  std::mt19937_64 rng(mt::testing::test_seed() + 4);
  check_prepacked<float>(rng);
  check_prepacked<double>(rng);
}

}  // namespace
}  // namespace mt::cpu
