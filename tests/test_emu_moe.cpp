// The CUDA kernels of the mixture-of-experts ops (kernels/cuda/moe_kernels.cuh) on the warp emulator,
// against their CPU twins (kernels/cpu/moe.cpp), bit for bit: the router's softmax, top-k (ties
// included) and gates, its backward, the dispatch plan (dropless, with capacity drops, with experts
// that get no token, over more assignments than the count kernel has threads), and the permute /
// unpermute / combine moves and their backwards in every storage type. The router's statistics are
// summed in a different order (a block's tree, the twin in token order) and agree to 1e-12.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/moe_kernels.cuh"
#include "runtime/storage.h"
#include "tests/emu_test_util.h"
#include "tests/test_util.h"

namespace {

using mt::testing::random_floats;
using mt::testing::random_ints;
using namespace mt::testing::emu;  // run, nans, EmulatedTest (tests/emu_test_util.h)
using mt::cuda::dev_ptr;
namespace mk = mt::cuda::moe_kernels;

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

struct RouteShape {
  int N, E, K;
  bool bias;
};
// Top-1 and top-k; more tokens than a block; an expert count past a warp; K = E (every expert chosen).
const RouteShape kRoutes[] = {{7, 4, 1, false}, {300, 8, 2, true}, {33, 40, 3, false}, {5, 3, 3, true}};

// Logits on a coarse grid (multiples of 1/4 in [-2, 2]) so that equal scores, and so the tie rule,
// occur in most tokens.
std::vector<float> tied_logits(size_t n, std::mt19937_64& rng) {
  std::vector<float> z;
  for (int32_t v : random_ints(n, -8, 8, rng)) z.push_back(float(v) / 4.f);
  return z;
}

// The routing of both sides: the twin's and the kernel's outputs.
struct Routed {
  std::vector<float> probs, lse, gate;
  std::vector<double> lse_sq;
  std::vector<int32_t> expert;
};

Routed route_cpu(const std::vector<float>& z, const float* bias, const RouteShape& s) {
  Routed r{std::vector<float>(size_t(s.N) * s.E), std::vector<float>(size_t(s.N)),
           std::vector<float>(size_t(s.N) * s.K),
           std::vector<double>(size_t(s.N)), std::vector<int32_t>(size_t(s.N) * s.K)};
  mt::cpu::moe_route(r.probs.data(), r.lse.data(), r.lse_sq.data(), r.expert.data(), r.gate.data(), z.data(), bias,
                     s.N, s.E, s.K);
  return r;
}

Routed route_emulated(const std::vector<float>& z, const float* bias, const RouteShape& s) {
  Routed r{nans<float>(size_t(s.N) * s.E), nans<float>(size_t(s.N)), nans<float>(size_t(s.N) * s.K),
           nans<double>(size_t(s.N)), std::vector<int32_t>(size_t(s.N) * s.K, -7)};
  run(mk::items_shape(s.N), mk::route_kernel, r.probs.data(), r.lse.data(), r.lse_sq.data(), r.expert.data(),
      r.gate.data(), z.data(), bias, s.N, s.E, s.K);
  return r;
}

TEST(EmulatedMoe, RouterMatchesTheCpuBitForBit) {
  std::mt19937_64 rng(mt::testing::test_seed());
  for (const RouteShape& s : kRoutes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " E=" << s.E << " K=" << s.K << " bias=" << s.bias);
    const auto z = tied_logits(size_t(s.N) * s.E, rng);
    const auto b = random_floats(size_t(s.E), rng, -0.1f, 0.1f);
    const float* bias = s.bias ? b.data() : nullptr;
    const Routed want = route_cpu(z, bias, s), got = route_emulated(z, bias, s);
    EXPECT_TRUE(same_bits(got.probs, want.probs)) << "probs";
    EXPECT_TRUE(same_bits(got.lse, want.lse)) << "lse";
    EXPECT_TRUE(same_bits(got.lse_sq, want.lse_sq)) << "lse_sq";
    EXPECT_EQ(got.expert, want.expert);
    EXPECT_TRUE(same_bits(got.gate, want.gate)) << "gate";
    // The statistics: the column sums of probs and the sum of lse_sq.
    std::vector<double> sums(size_t(s.E) + 1), got_sums = nans<double>(sums.size());
    mt::cpu::moe_route_stats(sums.data(), want.probs.data(), want.lse_sq.data(), s.N, s.E);
    run(mk::stats_shape(s.E), mk::route_stats_kernel, got_sums.data(), static_cast<const float*>(want.probs.data()),
        static_cast<const double*>(want.lse_sq.data()), s.N, s.E);
    for (size_t i = 0; i < sums.size(); i++) EXPECT_NEAR(got_sums[i], sums[i], 1e-12 * std::fabs(sums[i])) << i;
  }
}

// The tie rule itself: equal logits choose the lower experts, and a bias moves the choice without
// touching the gates.
TEST(EmulatedMoe, RouterTiesGoToTheLowerExpert) {
  const RouteShape s{1, 4, 2, false};
  const std::vector<float> z = {0.5f, 1.f, 1.f, 1.f};
  const Routed r = route_emulated(z, nullptr, s);
  EXPECT_EQ(r.expert, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.gate[0], 0.5f);
  const std::vector<float> bias = {0.f, 0.f, 0.f, 0.01f};
  const Routed b = route_emulated(z, bias.data(), s);
  EXPECT_EQ(b.expert, (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(b.gate, r.gate);
}

// A plan on both sides: load, offsets, each assignment's row and each row's assignment.
struct Plan {
  std::vector<int32_t> load, offset, row_of, assignment_of;
};
Plan plan_cpu(const std::vector<int32_t>& expert, int N, int K, int E, int64_t cap) {
  Plan p{std::vector<int32_t>(size_t(E)), std::vector<int32_t>(size_t(E) + 1), std::vector<int32_t>(expert.size()),
         std::vector<int32_t>(expert.size(), -9)};
  mt::cpu::moe_plan(p.load.data(), p.offset.data(), p.row_of.data(), p.assignment_of.data(), expert.data(), N, K, E,
                    cap);
  p.assignment_of.resize(size_t(p.offset.back()));
  return p;
}
// The launcher's three kernels in its order (moe.cu).
Plan plan_emulated(const std::vector<int32_t>& expert, int N, int K, int E, int64_t cap) {
  const int64_t A = int64_t(N) * K;
  Plan p{std::vector<int32_t>(size_t(E), -5), std::vector<int32_t>(size_t(E) + 1, -5),
         std::vector<int32_t>(expert.size(), -5), std::vector<int32_t>(expert.size(), -9)};
  run(mk::plan_count_shape(E), mk::plan_count_kernel, p.load.data(), p.row_of.data(), expert.data(), A);
  run(mk::single_shape(), mk::plan_offsets_kernel, p.offset.data(), static_cast<const int32_t*>(p.load.data()), E, cap);
  if (A > 0)
    run(mk::items_shape(A), mk::plan_rows_kernel, p.row_of.data(), p.assignment_of.data(), expert.data(),
        static_cast<const int32_t*>(p.offset.data()), A, cap);
  p.assignment_of.resize(size_t(p.offset.back()));
  return p;
}

struct PlanCase {
  int N, K, E, used;  // experts [0, used) get tokens, the others none
  int64_t cap;        // -1: dropless
};
// Dropless; drops at a capacity; experts with no token (with and without a capacity); more
// assignments than the count kernel's 256 threads (segments of several) and fewer (empty segments);
// capacity 0 (everything dropped).
const PlanCase kPlans[] = {{10, 2, 4, 4, -1}, {300, 2, 8, 8, 60}, {50, 1, 6, 3, -1}, {700, 2, 8, 5, 100},
                           {3, 1, 4, 4, 0},   {129, 3, 5, 2, 40}};

TEST(EmulatedMoe, PlanMatchesTheCpu) {
  std::mt19937_64 rng(mt::testing::test_seed());
  for (const PlanCase& c : kPlans) {
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " K=" << c.K << " E=" << c.E << " used=" << c.used
                                      << " cap=" << c.cap);
    const auto expert = random_ints(size_t(c.N) * c.K, 0, c.used - 1, rng);
    const Plan want = plan_cpu(expert, c.N, c.K, c.E, c.cap), got = plan_emulated(expert, c.N, c.K, c.E, c.cap);
    EXPECT_EQ(got.load, want.load);
    EXPECT_EQ(got.offset, want.offset);
    EXPECT_EQ(got.row_of, want.row_of);
    EXPECT_EQ(got.assignment_of, want.assignment_of);
    int dropped = 0;
    for (int32_t r : got.row_of) dropped += r < 0;
    if (c.cap >= 0 && c.N * c.K > c.cap * c.used) {
      EXPECT_GT(dropped, 0) << "the case was meant to drop";
    }
    for (int e = c.used; e < c.E; e++) EXPECT_EQ(got.load[size_t(e)], 0);
  }
}

// The router's backward: the gates' gradient, the balance term over the plan's load, and the z-loss.
TEST(EmulatedMoe, RouterBackwardMatchesTheCpuBitForBit) {
  std::mt19937_64 rng(mt::testing::test_seed());
  for (const RouteShape& s : kRoutes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " E=" << s.E << " K=" << s.K);
    const auto z = random_floats(size_t(s.N) * s.E, rng, -3.f, 3.f);
    const Routed r = route_cpu(z, nullptr, s);
    const Plan p = plan_cpu(r.expert, s.N, s.K, s.E, -1);
    const auto dgate = random_floats(size_t(s.N) * s.K, rng);
    std::vector<float> want(size_t(s.N) * s.E), got = nans<float>(want.size());
    mt::cpu::moe_route_bwd(want.data(), dgate.data(), r.probs.data(), r.lse.data(), r.expert.data(), r.gate.data(),
                           p.load.data(), s.N, s.E, s.K, 0.03, 0.002);
    run(mk::items_shape(s.N), mk::route_bwd_kernel, got.data(), dgate.data(), r.probs.data(), r.lse.data(),
        r.expert.data(), r.gate.data(), p.load.data(), s.N, s.E, s.K, 0.03, 0.002);
    EXPECT_TRUE(same_bits(got, want));
  }
}

template <class S>
class EmulatedMoeMoves : public EmulatedTest<S> {};
TYPED_TEST_SUITE(EmulatedMoeMoves, StorageTypes, StorageNames);

// Permute, unpermute, the permute's backward (with and without the fp32 extra), the combine (without a
// base, with one, in place over it) and its backward, on plans with drops and idle experts.
TYPED_TEST(EmulatedMoeMoves, MovesMatchTheCpuBitForBit) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  for (const PlanCase& c : kPlans) {
    const int C = 19;
    SCOPED_TRACE(::testing::Message() << "N=" << c.N << " K=" << c.K << " E=" << c.E << " cap=" << c.cap);
    const auto expert = random_ints(size_t(c.N) * c.K, 0, c.used - 1, this->rng);
    const Plan p = plan_cpu(expert, c.N, c.K, c.E, c.cap);
    const int64_t M = p.offset.back(), A = int64_t(c.N) * c.K, NC = int64_t(c.N) * C;
    const auto x = this->values(size_t(NC)), rows = this->values(size_t(M * C)), dy = this->values(size_t(NC));
    const auto base = this->values(size_t(NC));
    const auto gate = this->floats(size_t(A)), extra = this->floats(size_t(NC));
    const int32_t* row_of = p.row_of.data();
    const int32_t* asg = p.assignment_of.data();

    std::vector<S> want(size_t(M * C)), got = nans<S>(want.size());
    mt::cpu::moe_permute<S>(want.data(), x.data(), asg, M, c.K, C);
    if (M > 0)
      run(mk::items_shape(M * C), mk::permute_kernel<D>, dev_ptr(got.data()), dev_ptr(x.data()), asg, c.K, C, M * C);
    EXPECT_TRUE(same_bits(got, want)) << "permute";

    want.assign(size_t(A * C), S{}), got = nans<S>(want.size());
    mt::cpu::moe_unpermute<S>(want.data(), rows.data(), row_of, A, C);
    run(mk::items_shape(A * C), mk::unpermute_kernel<D>, dev_ptr(got.data()), dev_ptr(rows.data()), row_of, C, A * C);
    EXPECT_TRUE(same_bits(got, want)) << "unpermute";

    for (const float* ex : {static_cast<const float*>(nullptr), extra.data()}) {
      want.assign(size_t(NC), S{}), got = nans<S>(want.size());
      mt::cpu::moe_permute_bwd<S>(want.data(), rows.data(), ex, row_of, c.N, c.K, C);
      run(mk::items_shape(NC), mk::permute_bwd_kernel<D>, dev_ptr(got.data()), dev_ptr(rows.data()), ex, row_of, c.K,
          C, NC);
      EXPECT_TRUE(same_bits(got, want)) << "permute backward, extra " << (ex != nullptr);
    }

    for (int mode = 0; mode < 3; mode++) {  // no base; a base; in place over the base
      want = mode == 0 ? std::vector<S>(size_t(NC)) : base;
      got = mode == 2 ? base : nans<S>(size_t(NC));
      mt::cpu::moe_combine<S>(want.data(), rows.data(), gate.data(), mode == 0 ? nullptr : want.data(), row_of, c.N,
                              c.K, C);
      const S* b = mode == 0 ? nullptr : mode == 1 ? base.data() : got.data();
      run(mk::items_shape(NC), mk::combine_kernel<D>, dev_ptr(got.data()), dev_ptr(rows.data()), gate.data(),
          dev_ptr(b), row_of, c.K, C, NC);
      EXPECT_TRUE(same_bits(got, want)) << "combine, mode " << mode;
    }

    std::vector<S> drows(size_t(M * C)), got_drows = nans<S>(drows.size());
    std::vector<float> dgate(static_cast<size_t>(A)), got_dgate = nans<float>(dgate.size());
    mt::cpu::moe_combine_bwd<S>(drows.data(), dgate.data(), dy.data(), rows.data(), gate.data(), row_of, c.N, c.K, C);
    if (M > 0)
      run(mk::items_shape(M * C), mk::combine_bwd_rows_kernel<D>, dev_ptr(got_drows.data()), dev_ptr(dy.data()),
          gate.data(), asg, c.K, C, M * C);
    run(mk::items_shape(A), mk::combine_bwd_gate_kernel<D>, got_dgate.data(), dev_ptr(dy.data()), dev_ptr(rows.data()),
        row_of, c.K, C, A);
    EXPECT_TRUE(same_bits(got_drows, drows)) << "combine backward, rows";
    EXPECT_TRUE(same_bits(got_dgate, dgate)) << "combine backward, gates";
  }
}

}  // namespace
