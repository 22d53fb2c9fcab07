// The CUDA kernels of the vocabulary-parallel ops (kernels/cuda/vocab_parallel_kernels.cuh and the
// row-range scatter of encoder_kernels.cuh) on the warp emulator, against the CPU twins
// (kernels/cpu/vocab_parallel.cpp): the row-split embedding forward exactly, its backward and the
// sliced cross-entropy to the same tolerances as the whole-table kernels. Every slice of a split is
// run, so a wrong column offset, a padded column written, or a merge that skips a rank shows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/tolerances.h"
#include "kernels/cuda/vocab_parallel_kernels.cuh"
#include "runtime/storage.h"
#include "tests/emu_test_util.h"
#include "tests/test_util.h"

namespace {

using mt::testing::random_ints;
using namespace mt::testing::emu;  // run, emulated_scatter, error, nans, EmulatedTest (tests/emu_test_util.h)
using mt::cuda::dev_ptr;
namespace tol = mt::cuda::tol;
namespace vpk = mt::cuda::vocab_parallel_kernels;

template <class S>
class EmulatedVocabParallel : public EmulatedTest<S> {};
TYPED_TEST_SUITE(EmulatedVocabParallel, StorageTypes, StorageNames);

struct Split { int V, P, C, N; };
// One slice; two and three slices of a small vocabulary (ids repeat: long runs after the sort); C = 257
// takes two column blocks of the scatter.
const Split kSplits[] = {{5, 1, 3, 4}, {12, 2, 13, 40}, {9, 3, 7, 11}, {8, 4, 257, 9}};

TYPED_TEST(EmulatedVocabParallel, EmbeddingSlicesMatchTheCpu) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  for (const Split& s : kSplits) {
    const int rows = s.V / s.P;
    const auto ids = random_ints(size_t(s.N), 0, s.V - 1, this->rng);
    const auto table = this->values(size_t(s.V) * s.C);
    const auto dout = this->values(size_t(s.N) * s.C);
    for (int r = 0; r < s.P; r++) {
      SCOPED_TRACE(::testing::Message() << "V=" << s.V << " P=" << s.P << " C=" << s.C << " rank=" << r);
      const S* part = table.data() + size_t(r) * rows * s.C;
      std::vector<S> want(size_t(s.N) * s.C), got = nans<S>(want.size());
      mt::cpu::embedding_fwd<S>(want.data(), ids.data(), part, r * rows, rows, s.N, s.C);
      const int64_t total = int64_t(s.N) * s.C;
      run(vpk::embedding_shape(total), vpk::embedding_fwd_kernel<D>, dev_ptr(got.data()), ids.data(),
          dev_ptr(part), r * rows, rows, s.C, total);
      EXPECT_LE(error(got, want), tol::kExact.of<S>()) << "forward";
      auto dtable = this->floats(size_t(rows) * s.C);  // gradients accumulate onto what is there
      auto got_d = dtable;
      mt::cpu::embedding_bwd<S>(dtable.data(), dout.data(), ids.data(), r * rows, rows, s.N, s.C);
      emulated_scatter(got_d.data(), dev_ptr(dout.data()), ids.data(), s.N, 1, s.C, r * rows, rows);
      EXPECT_LE(error(got_d, dtable), tol::kEncoderBwd.of<S>()) << "backward";
    }
  }
}

// Every rank's statistics (rows of three, rank-major as the all-gather leaves them), its losses and its
// slice's gradient, emulated and on the CPU. dlogits may alias the logits (in place).
TYPED_TEST(EmulatedVocabParallel, SlicedCrossEntropyMatchesTheCpu) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  struct Shape { int N, V, Vp, P; };
  // Padded columns on the last slice, a last slice of padding only (V=10, Vp=16, P=4 gives slices of
  // 4: the fourth holds columns 12-15), a slice wider than a block (1031 columns).
  for (Shape s : {Shape{3, 7, 8, 1}, Shape{5, 100, 128, 2}, Shape{4, 10, 16, 4}, Shape{3, 2050, 2062, 2}}) {
    const int Vl = s.Vp / s.P;
    auto targets = random_ints(size_t(s.N), 0, s.V - 1, this->rng);
    if (s.N > 1) targets[1] = -1;  // an ignored position
    const auto logits = this->values(size_t(s.N) * s.Vp, -4.f, 4.f);
    std::vector<std::vector<S>> slices(size_t(s.P));
    for (int r = 0; r < s.P; r++)
      for (int i = 0; i < s.N; i++)
        for (int j = 0; j < Vl; j++) slices[size_t(r)].push_back(logits[size_t(i) * s.Vp + size_t(r) * Vl + j]);
    std::vector<float> stats(size_t(s.P) * s.N * 3), got_stats = nans<float>(stats.size());
    for (int r = 0; r < s.P; r++) {
      mt::cpu::xent_slice_stats<S>(stats.data() + size_t(r) * s.N * 3, slices[size_t(r)].data(), targets.data(),
                                   r * Vl, s.N, s.V, Vl);
      run(vpk::slice_shape(s.N), vpk::xent_slice_stats_kernel<D>, got_stats.data() + size_t(r) * s.N * 3,
          dev_ptr(slices[size_t(r)].data()), targets.data(), r * Vl, s.V, Vl);
    }
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp << " P=" << s.P);
    for (size_t k = 0; k < stats.size(); k++) {
      if (std::isinf(stats[k])) {
        EXPECT_EQ(got_stats[k], stats[k]) << k;
      } else {
        EXPECT_NEAR(got_stats[k], stats[k], tol::kSoftmaxXentLoss.of<S>() * (1 + std::fabs(stats[k]))) << k;
      }
    }
    // Both sides finish from the CPU's statistics, so the finish kernel is measured alone.
    const float dloss = 1.f / float(s.N);
    for (int r = 0; r < s.P; r++) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "rank=" << r << " in_place=" << in_place);
        std::vector<float> losses(size_t(s.N)), got_losses = nans<float>(size_t(s.N));
        std::vector<S> dlogits(slices[size_t(r)].size()), got_d = nans<S>(dlogits.size());
        auto got_logits = slices[size_t(r)];
        mt::cpu::xent_slice_finish<S>(losses.data(), dlogits.data(), slices[size_t(r)].data(), stats.data(), s.P,
                                      targets.data(), dloss, r * Vl, s.N, s.V, Vl);
        D* g = dev_ptr(in_place ? got_logits.data() : got_d.data());
        run(vpk::slice_shape(s.N), vpk::xent_slice_finish_kernel<D>, got_losses.data(), g,
            dev_ptr(got_logits.data()), static_cast<const float*>(stats.data()), s.P,
            static_cast<const int32_t*>(targets.data()), dloss, r * Vl, s.N, s.V, Vl);
        EXPECT_LE(error(got_losses, losses), tol::kSoftmaxXentLoss.of<S>()) << "losses";
        EXPECT_LE(error(in_place ? got_logits : got_d, dlogits), tol::kSoftmaxXentGrad.of<S>()) << "dlogits";
      }
    }
  }
}

// A target past the real vocabulary gives NaN loss and gradient on the GPU (the CPU twin refuses it),
// and leaves the other rows alone.
TYPED_TEST(EmulatedVocabParallel, SlicedCrossEntropyGivesNaNForATargetPastTheVocabulary) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  const int N = 2, V = 6, Vl = 4;  // one slice of a padded 8-column vocabulary: rank 1 holds 4-7
  const std::vector<int32_t> targets = {V, 4};
  const auto logits = this->values(size_t(N) * Vl);
  std::vector<float> stats = {0.5f, 2.f, 0.f, 0.5f, 2.f, 0.25f};  // rank 1's own statistics only (P = 1)
  std::vector<float> got = nans<float>(N);
  std::vector<S> got_d = nans<S>(logits.size());
  run(vpk::slice_shape(N), vpk::xent_slice_finish_kernel<D>, got.data(), dev_ptr(got_d.data()),
      dev_ptr(logits.data()), static_cast<const float*>(stats.data()), 1, targets.data(), 1.f, 4, N, V, Vl);
  EXPECT_TRUE(std::isnan(got[0]));
  for (int j = 0; j < Vl; j++) EXPECT_TRUE(std::isnan(mt::load(got_d[size_t(j)]))) << j;
  EXPECT_FALSE(std::isnan(got[1]));
  for (int j = 0; j < Vl; j++) EXPECT_FALSE(std::isnan(mt::load(got_d[size_t(Vl + j)]))) << j;
  for (int j = 2; j < Vl; j++) EXPECT_EQ(mt::load(got_d[size_t(Vl + j)]), 0.f) << "padded column " << j;
}

}  // namespace
