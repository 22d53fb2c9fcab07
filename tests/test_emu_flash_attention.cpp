// The fp32 SIMT flash attention kernels (kernels/cuda/flash_attention_kernels.cuh), built by the host
// compiler and run on the warp emulator (kernels/cuda/warp_emulation.h) against the CPU twin
// (kernels/cpu/flash_attention.cpp), in float, bf16 and fp16: every head-dimension split of the lanes
// (ND = 1 .. 4, head sizes up to 128, odd ones among them), partial tiles, one token, and packed
// documents. The tensor-core kernels have their own test (test_emu_flash_mma.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/cuda/tolerances.h"
#include "runtime/storage.h"
#include "tests/emu_test_util.h"
#include "tests/test_util.h"

namespace {

using namespace mt::testing::emu;  // run, to_storage, to_floats, error, part_error, nans (tests/emu_test_util.h)
using mt::bf16;
using mt::f16;
using mt::cuda::dev_ptr;
using mt::cuda::LaunchShape;
using mt::testing::kLseFloor;
using mt::testing::max_rel_error;
namespace fk = mt::cuda::flash_attention_kernels;
namespace tol = mt::cuda::tol;

using Shape = AttnShape;
// Head sizes 8 (ND = 1), 13 (odd, lanes 13..31 idle), 48 (ND = 2), 80 (ND = 3), 128 (ND = 4);
// T = 1, 33, 65, 70 and 130 end in partial 64-row tiles.
const Shape kShapes[] = {{1, 1, 8, 1, false},  {2, 33, 26, 2, true},  {2, 70, 96, 2, false},
                         {1, 130, 80, 1, true}, {1, 65, 128, 1, false}};

// The launchers' dispatch on the lanes' share of the head dimensions.
template <class D>
void fwd(D* out, float* lse, const D* qkv, const int32_t* doc, const Shape& s) {
  const int hs = s.C / s.NH;
  const LaunchShape l = fk::fwd_shape(s.B, s.T, s.NH, hs);
  const float scale = 1.f / std::sqrt(float(hs));
  switch (fk::head_chunks(hs)) {
    case 1: return run(l, fk::flash_fwd_kernel<D, 1>, out, lse, qkv, doc, s.T, s.C, s.NH, scale);
    case 2: return run(l, fk::flash_fwd_kernel<D, 2>, out, lse, qkv, doc, s.T, s.C, s.NH, scale);
    case 3: return run(l, fk::flash_fwd_kernel<D, 3>, out, lse, qkv, doc, s.T, s.C, s.NH, scale);
    default: return run(l, fk::flash_fwd_kernel<D, 4>, out, lse, qkv, doc, s.T, s.C, s.NH, scale);
  }
}

template <class D, int ND>
void bwd_tiles(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* dsum, const int32_t* doc,
               const Shape& s) {
  const int hs = s.C / s.NH;
  const float scale = 1.f / std::sqrt(float(hs));
  run(fk::dkdv_shape(s.B, s.T, s.NH, hs), fk::flash_bwd_dkdv_kernel<D, ND>, dqkv, dout, qkv, lse, dsum, doc, s.T, s.C,
      s.NH, scale);
  run(fk::dq_shape(s.B, s.T, s.NH, hs), fk::flash_bwd_dq_kernel<D, ND>, dqkv, dout, qkv, lse, dsum, doc, s.T, s.C,
      s.NH, scale);
}

// flash_attention_bwd's sequence: D = rowsum(dO * O) into the scratch, then the dK/dV and dQ kernels.
template <class D>
void bwd(D* dqkv, float* scratch, const D* dout, const D* qkv, const D* out, const float* lse, const int32_t* doc,
         const Shape& s) {
  const int64_t rows = int64_t(s.B) * s.NH * s.T;
  run(fk::dsum_shape(rows), fk::flash_dsum_kernel<D>, scratch, dout, out, s.B, s.T, s.C, s.NH);
  switch (fk::head_chunks(s.C / s.NH)) {
    case 1: return bwd_tiles<D, 1>(dqkv, dout, qkv, lse, scratch, doc, s);
    case 2: return bwd_tiles<D, 2>(dqkv, dout, qkv, lse, scratch, doc, s);
    case 3: return bwd_tiles<D, 3>(dqkv, dout, qkv, lse, scratch, doc, s);
    default: return bwd_tiles<D, 4>(dqkv, dout, qkv, lse, scratch, doc, s);
  }
}

template <class S>
class FlashSimtEmulated : public EmulatedTest<S> {};
TYPED_TEST_SUITE(FlashSimtEmulated, StorageTypes, StorageNames);

TYPED_TEST(FlashSimtEmulated, ForwardMatchesTheCpuTwin) {
  using S = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(label(s));
    const size_t nout = s.nout(), nlse = s.nlse();
    const AttnInputs<S> in(s, this->rng);
    const std::vector<S>& qkv = in.qkv;
    const int32_t* d = in.doc;
    std::vector<S> ref(nout), out = nans<S>(nout);
    std::vector<float> ref_lse(nlse), lse = nans<float>(nlse);
    mt::cpu::flash_attention_fwd<S>(ref.data(), ref_lse.data(), qkv.data(), d, s.B, s.T, s.C, s.NH);
    fwd(dev_ptr(out.data()), lse.data(), dev_ptr(qkv.data()), d, s);
    EXPECT_LE(part_error(out, ref, s.B * s.T, s.C, 0, s.C, 1e-12), tol::kFlashFwd.of<S>()) << "out";
    EXPECT_LE(max_rel_error(lse.data(), ref_lse.data(), nlse, kLseFloor), tol::kFlashLse.of<S>()) << "lse";
  }
}

TYPED_TEST(FlashSimtEmulated, BackwardMatchesTheCpuTwin) {
  using S = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(label(s));
    const size_t nqkv = s.nqkv(), nout = s.nout(), nlse = s.nlse();
    const AttnInputs<S> in(s, this->rng);
    const std::vector<S>& qkv = in.qkv;
    const auto dout = to_storage<S>(mt::testing::random_floats(nout, this->rng));
    const int32_t* d = in.doc;
    // Both sides start from the CPU forward's out and lse, as the GPU tests do.
    std::vector<S> out(nout), ref(nqkv), dqkv = nans<S>(nqkv);
    std::vector<float> lse(nlse), ref_dsum(nlse), dsum = nans<float>(nlse);
    mt::cpu::flash_attention_fwd<S>(out.data(), lse.data(), qkv.data(), d, s.B, s.T, s.C, s.NH);
    mt::cpu::flash_attention_bwd<S>(ref.data(), ref_dsum.data(), dout.data(), qkv.data(), out.data(), lse.data(), d,
                                    s.B, s.T, s.C, s.NH);
    bwd(dev_ptr(dqkv.data()), dsum.data(), dev_ptr(dout.data()), dev_ptr(qkv.data()), dev_ptr(out.data()),
        static_cast<const float*>(lse.data()), d, s);

    // D is an fp32 dot product of the same stored values on both sides.
    EXPECT_LE(max_rel_error(dsum.data(), ref_dsum.data(), nlse), tol::kFlashBwd.f32) << "D = rowsum(dO * O)";
    const std::vector<double> errs = dqkv_errors(dqkv, ref, s.B, s.T, s.C);
    const char* part[3] = {"dQ", "dK", "dV"};
    for (int p = 0; p < 3; p++) EXPECT_LE(errs[size_t(p)], tol::kFlashBwd.of<S>()) << part[p];
  }
}

}  // namespace
