// The tensor-core flash attention kernels (kernels/cuda/flash_attention_mma_kernels.cuh), built by the
// host compiler and run on the warp emulator (kernels/cuda/warp_emulation.h), against the CPU twin
// (kernels/cpu/flash_attention.cpp) in bf16 and fp16: every head size the kernels take, partial tiles,
// one token, tiles wholly below the diagonal (the unmasked fast path), and packed documents.
//
// This checks the kernels' indexing, masks, fragment handling and online softmax without a GPU; the
// GPU tests (tests/test_cuda_attention.cpp) and `minitrain selftest` check the same kernels on the
// device. The kernels stream tiles through double buffers with cp.async; each case runs under both
// of the emulator's timings (copies landing late with the warps in step; copies landing at once
// with each warp running ahead), so that a missing wait (a tile read before it lands) and a missing
// barrier (a buffer refilled while a warp still reads it) both fail. Tolerances are the GPU's (kernels/cuda/tolerances.h): the emulated mma sums in a different
// order from the tensor cores, but rounds P and dS to 16 bits exactly as they do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/flash_attention_mma_kernels.cuh"
#include "kernels/cuda/tolerances.h"
#include "runtime/storage.h"
#include "tests/emu_test_util.h"
#include "tests/test_util.h"

namespace {

using namespace mt::testing::emu;  // run, to_storage, to_floats, error, part_error, nans (tests/emu_test_util.h)
using mt::cuda::emu::Timing;
using mt::cuda::emu::TimingScope;
using mt::bf16;
using mt::f16;
using mt::testing::kLseFloor;
using mt::testing::max_rel_error;
namespace fk = mt::cuda::flash_mma::kernels;
namespace tol = mt::cuda::tol;

template <class S>
class FlashMmaEmulated : public ::testing::Test {
 protected:
  std::mt19937_64 rng{mt::testing::test_seed()};
};
using StorageTypes = ::testing::Types<bf16, f16>;
TYPED_TEST_SUITE(FlashMmaEmulated, StorageTypes);

using Shape = AttnShape;
// hs = C / NH = 64 (GPT-2's), 32 and 128 (forward only); T = 1, 70 and 130 end in partial tiles,
// T = 192 has whole tiles below the diagonal. At hs = 32 the forward's warps own two row tiles (128-row
// blocks): T = 65 is one partial block, T = 200 two blocks with whole tiles below the diagonal and
// warps that skip the block's last key tile.
const Shape kShapes[] = {{1, 1, 64, 1, false},  {2, 70, 128, 2, false}, {1, 130, 64, 1, true},
                         {1, 192, 64, 1, false}, {2, 65, 64, 2, true},  {1, 70, 256, 2, true},
                         {1, 200, 64, 2, false}};

template <class D, int HS>
struct Run {
  // The launchers' shapes (flash_attention_mma.cu uses the same functions).
  static void fwd(D* out, float* lse, const D* qkv, const int32_t* doc, const Shape& s) {
    const mt::cuda::LaunchShape ls = fk::fwd_shape<D, HS>(s.B, s.T, s.NH);
    const float scale_log2 = fk::kLog2e / std::sqrt(float(HS));
    mt::cuda::emu::launch(ls.grid, ls.block, ls.smem, fk::fwd_kernel<D, HS>, out, lse, qkv, doc, s.T, s.C, s.NH,
                          scale_log2);
  }
  static void bwd(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* dsum, const int32_t* doc,
                  const Shape& s) {
    const mt::cuda::LaunchShape ls = fk::bwd_shape<D, HS>(s.B, s.T, s.NH);
    const float scale = 1.f / std::sqrt(float(HS)), scale_log2 = fk::kLog2e * scale;
    mt::cuda::emu::launch(ls.grid, ls.block, ls.smem, fk::dkdv_kernel<D, HS>, dqkv, dout, qkv, lse, dsum, doc, s.T,
                          s.C, s.NH, scale, scale_log2);
    mt::cuda::emu::launch(ls.grid, ls.block, ls.smem, fk::dq_kernel<D, HS>, dqkv, dout, qkv, lse, dsum, doc, s.T, s.C,
                          s.NH, scale, scale_log2);
  }
};

template <class D>
void run_fwd(D* out, float* lse, const D* qkv, const int32_t* doc, const Shape& s) {
  switch (s.C / s.NH) {
    case 32: return Run<D, 32>::fwd(out, lse, qkv, doc, s);
    case 64: return Run<D, 64>::fwd(out, lse, qkv, doc, s);
    case 128: return Run<D, 128>::fwd(out, lse, qkv, doc, s);
  }
  FAIL() << "no forward kernel for head size " << s.C / s.NH;
}
template <class D>
void run_bwd(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* dsum, const int32_t* doc,
             const Shape& s) {
  switch (s.C / s.NH) {
    case 32: return Run<D, 32>::bwd(dqkv, dout, qkv, lse, dsum, doc, s);
    case 64: return Run<D, 64>::bwd(dqkv, dout, qkv, lse, dsum, doc, s);
  }
  FAIL() << "no backward kernel for head size " << s.C / s.NH;
}

TYPED_TEST(FlashMmaEmulated, ForwardMatchesTheCpuTwin) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(label(s));
    const size_t nout = s.nout(), nlse = s.nlse();
    const AttnInputs<S> in(s, this->rng);
    const std::vector<S>& qkv = in.qkv;
    const int32_t* d = in.doc;
    std::vector<S> ref(nout);
    std::vector<float> ref_lse(nlse);
    mt::cpu::flash_attention_fwd<S>(ref.data(), ref_lse.data(), qkv.data(), d, s.B, s.T, s.C, s.NH);

    for (Timing timing : {Timing::late, Timing::early}) {
      SCOPED_TRACE(timing == Timing::late ? "late timing" : "early timing");
      const TimingScope scope(timing);
      std::vector<S> out = nans<S>(nout);  // an unwritten output fails
      std::vector<float> lse(nlse, NAN);
      run_fwd(reinterpret_cast<D*>(out.data()), lse.data(), reinterpret_cast<const D*>(qkv.data()), d, s);
      const auto o = to_floats(out), r = to_floats(ref);
      EXPECT_LE(max_rel_error(o.data(), r.data(), nout), tol::kFlashFwd.of<S>());
      EXPECT_LE(max_rel_error(lse.data(), ref_lse.data(), nlse, kLseFloor), tol::kFlashLse.of<S>());
    }
  }
}

TYPED_TEST(FlashMmaEmulated, BackwardMatchesTheCpuTwin) {
  using S = TypeParam;
  using D = mt::cuda::dev_t<S>;
  for (const Shape& s : kShapes) {
    if (s.C / s.NH > 64) continue;  // no tensor-core backward at head size 128 (the SIMT kernels run)
    SCOPED_TRACE(label(s));
    const size_t nqkv = s.nqkv(), nout = s.nout(), nlse = s.nlse();
    const AttnInputs<S> in(s, this->rng);
    const std::vector<S>& qkv = in.qkv;
    const auto dout = to_storage<S>(mt::testing::random_floats(nout, this->rng));
    const int32_t* d = in.doc;
    // Both sides start from the CPU forward's out and lse, as on the GPU tests.
    std::vector<S> out(nout), ref(nqkv);
    std::vector<float> lse(nlse), scratch(nlse);
    mt::cpu::flash_attention_fwd<S>(out.data(), lse.data(), qkv.data(), d, s.B, s.T, s.C, s.NH);
    mt::cpu::flash_attention_bwd<S>(ref.data(), scratch.data(), dout.data(), qkv.data(), out.data(), lse.data(), d,
                                    s.B, s.T, s.C, s.NH);

    // D = rowsum(dO * O) per (b, h, query), as flash_attention.cu's dsum kernel computes it.
    const int hs = s.C / s.NH;
    std::vector<float> dsum(nlse);
    for (int b = 0; b < s.B; b++)
      for (int h = 0; h < s.NH; h++)
        for (int i = 0; i < s.T; i++) {
          float acc = 0.f;
          const size_t off = (size_t(b) * s.T + i) * s.C + size_t(h) * hs;
          for (int e = 0; e < hs; e++) acc += mt::load(dout[off + e]) * mt::load(out[off + e]);
          dsum[(size_t(b) * s.NH + h) * s.T + i] = acc;
        }
    for (Timing timing : {Timing::late, Timing::early}) {
      SCOPED_TRACE(timing == Timing::late ? "late timing" : "early timing");
      const TimingScope scope(timing);
      std::vector<S> dqkv = nans<S>(nqkv);  // an unwritten gradient fails
      run_bwd(reinterpret_cast<D*>(dqkv.data()), reinterpret_cast<const D*>(dout.data()),
              reinterpret_cast<const D*>(qkv.data()), lse.data(), dsum.data(), d, s);
      const std::vector<double> errs = dqkv_errors(dqkv, ref, s.B, s.T, s.C);
      const char* part[3] = {"dQ", "dK", "dV"};
      for (int p = 0; p < 3; p++) EXPECT_LE(errs[size_t(p)], tol::kFlashBwd.of<S>()) << part[p];
    }
  }
}

}  // namespace
