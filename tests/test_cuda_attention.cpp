// Both CUDA attention paths against their CPU twins, causal and document-masked, in each storage type:
// the materialised one (attention_fwd/bwd, T x T probabilities) and the flash one (flash_attention_*,
// 64-row tiles, online softmax, deterministic backward). Shapes cover T = 1, odd T, T just past a warp
// and past one, two and three tiles, and head sizes from 1 to the flash kernels' limit of 128. Each
// backward is compared on its own: both backends start from the CPU forward's saved tensors. The
// device tests skip without a GPU; the argument checks run everywhere.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/test_cuda_util.h"

namespace {

using namespace mt::testing;  // NOLINT: the test helpers (tests/test_util.h, tests/test_cuda_util.h)
using mt::bf16;
using mt::f16;

template <class S>
class CudaAttention : public CudaOps<S> {};
TYPED_TEST_SUITE(CudaAttention, StorageTypes, StorageNames);

struct AttnShape { int B, T, C, NH; };
// hs = C/NH: 4, 4, 8, 16, 48 and 1 (every per-head view of qkv only element-aligned).
const AttnShape kAttnShapes[] = {{1, 1, 4, 1}, {2, 7, 12, 3}, {3, 33, 40, 5}, {2, 64, 64, 4}, {1, 130, 96, 2},
                                 {2, 19, 5, 5}};
// The flash tiles are 64 rows: T = 64, 70, 129, 200 end on or past a tile boundary; hs = 1, 48 (two
// 32-lane chunks, the second partial), 96 and 128 (the limit). In bf16/fp16, hs = 32 and 64 run the
// tensor-core kernels both ways and hs = 128 forward (flash_attention_mma.cu); the rest the SIMT ones.
const AttnShape kFlashShapes[] = {{1, 1, 4, 1},    {2, 7, 12, 3},    {2, 64, 64, 4},  {3, 70, 40, 5},
                                  {2, 19, 5, 5},   {1, 129, 48, 1},  {2, 200, 96, 1}, {2, 70, 256, 2},
                                  {2, 200, 128, 2}, {1, 1, 64, 1},   {3, 65, 64, 2},  {1, 257, 768, 12}};

std::string label(const AttnShape& s, bool docs) {
  return mt::strfmt("B=%d T=%d C=%d NH=%d docs=%d", s.B, s.T, s.C, s.NH, int(docs));
}

TYPED_TEST(CudaAttention, MaterialisedForwardMatchesCpuAndMasksWithExactZeros) {
  using S = TypeParam;
  for (const AttnShape& s : kAttnShapes) {
    for (bool docs : {false, true}) {
      SCOPED_TRACE(label(s, docs));
      auto qkv = this->values(size_t(s.B) * s.T * 3 * s.C, -2.f, 2.f);
      auto doc = random_docs(s.B, s.T, this->rng);
      const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
      std::vector<S> out(size_t(s.B) * s.T * s.C), att(natt);
      mt::cpu::attention_fwd<S>(out.data(), att.data(), qkv.data(), docs ? doc.data() : nullptr, s.B, s.T, s.C, s.NH);
      DeviceArray<S> d_qkv(qkv), d_out(this->values(out.size())), d_att(this->values(natt));
      DeviceArray<int32_t> d_doc(doc);
      mt::cuda::attention_fwd<S>(d_out.get(), d_att.get(), d_qkv.get(), docs ? d_doc.get() : nullptr, s.B, s.T, s.C,
                                 s.NH, this->gpu);
      EXPECT_TRUE(close(d_out.host(), out, this->tol_of(tol::kAttentionFwd))) << "out";
      const std::vector<S> got_att = d_att.host();
      EXPECT_TRUE(close(got_att, att, this->tol_of(tol::kAttentionFwd))) << "att";
      size_t masked_nonzero = 0;
      for (size_t i = 0; i < natt; i++) masked_nonzero += mt::load(att[i]) == 0.f && mt::load(got_att[i]) != 0.f;
      EXPECT_EQ(masked_nonzero, 0u) << "entries a token may not attend to must be exactly 0";
    }
  }
}

TYPED_TEST(CudaAttention, MaterialisedBackwardMatchesCpu) {
  using S = TypeParam;
  for (const AttnShape& s : kAttnShapes) {
    for (bool docs : {false, true}) {
      SCOPED_TRACE(label(s, docs));
      auto qkv = this->values(size_t(s.B) * s.T * 3 * s.C, -2.f, 2.f);
      auto doc = random_docs(s.B, s.T, this->rng);
      const int32_t* cpu_doc = docs ? doc.data() : nullptr;
      const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
      std::vector<S> out(size_t(s.B) * s.T * s.C), att(natt), dqkv(qkv.size());
      std::vector<float> scratch(natt);
      mt::cpu::attention_fwd<S>(out.data(), att.data(), qkv.data(), cpu_doc, s.B, s.T, s.C, s.NH);
      auto dout = this->values(out.size());
      mt::cpu::attention_bwd<S>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), cpu_doc, s.B, s.T,
                                s.C, s.NH);
      DeviceArray<S> d_qkv(qkv), d_att(att), d_dout(dout), d_dqkv(this->values(qkv.size()));
      DeviceArray<float> d_scratch(random_floats(natt, this->rng));
      DeviceArray<int32_t> d_doc(doc);
      mt::cuda::attention_bwd<S>(d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(), d_att.get(),
                                 docs ? d_doc.get() : nullptr, s.B, s.T, s.C, s.NH, this->gpu);
      EXPECT_TRUE(close(d_dqkv.host(), dqkv, this->tol_of(tol::kAttentionBwd))) << "dqkv";
    }
  }
}

TYPED_TEST(CudaAttention, FlashForwardMatchesCpuOutputAndLogSumExp) {
  using S = TypeParam;
  for (const AttnShape& s : kFlashShapes) {
    for (bool docs : {false, true}) {
      SCOPED_TRACE(label(s, docs));
      auto qkv = this->values(size_t(s.B) * s.T * 3 * s.C, -2.f, 2.f);
      auto doc = random_docs(s.B, s.T, this->rng);
      std::vector<S> out(size_t(s.B) * s.T * s.C);
      std::vector<float> lse(size_t(s.B) * s.NH * s.T);
      mt::cpu::flash_attention_fwd<S>(out.data(), lse.data(), qkv.data(), docs ? doc.data() : nullptr, s.B, s.T, s.C,
                                      s.NH);
      DeviceArray<S> d_qkv(qkv), d_out(this->values(out.size()));
      DeviceArray<float> d_lse(random_floats(lse.size(), this->rng));
      DeviceArray<int32_t> d_doc(doc);
      mt::cuda::flash_attention_fwd<S>(d_out.get(), d_lse.get(), d_qkv.get(), docs ? d_doc.get() : nullptr, s.B, s.T,
                                       s.C, s.NH, this->gpu);
      EXPECT_TRUE(close(d_out.host(), out, this->tol_of(tol::kFlashFwd))) << "out";
      EXPECT_TRUE(close(d_lse.host(), lse, this->tol_of(tol::kFlashLse), kLseFloor)) << "lse";
    }
  }
}

TYPED_TEST(CudaAttention, FlashBackwardMatchesCpuAndIsBitwiseReproducible) {
  using S = TypeParam;
  for (const AttnShape& s : kFlashShapes) {
    for (bool docs : {false, true}) {
      SCOPED_TRACE(label(s, docs));
      auto qkv = this->values(size_t(s.B) * s.T * 3 * s.C, -2.f, 2.f);
      auto doc = random_docs(s.B, s.T, this->rng);
      const int32_t* cpu_doc = docs ? doc.data() : nullptr;
      std::vector<S> out(size_t(s.B) * s.T * s.C), dqkv(qkv.size());
      std::vector<float> lse(size_t(s.B) * s.NH * s.T), scratch(lse.size());
      mt::cpu::flash_attention_fwd<S>(out.data(), lse.data(), qkv.data(), cpu_doc, s.B, s.T, s.C, s.NH);
      auto dout = this->values(out.size());
      mt::cpu::flash_attention_bwd<S>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                      cpu_doc, s.B, s.T, s.C, s.NH);
      DeviceArray<S> d_qkv(qkv), d_out(out), d_dout(dout), d_dqkv(this->values(qkv.size())),
          d_dqkv2(this->values(qkv.size()));
      DeviceArray<float> d_lse(lse), d_scratch(random_floats(scratch.size(), this->rng));
      DeviceArray<int32_t> d_doc(doc);
      for (S* target : {d_dqkv.get(), d_dqkv2.get()})
        mt::cuda::flash_attention_bwd<S>(target, d_scratch.get(), d_dout.get(), d_qkv.get(), d_out.get(), d_lse.get(),
                                         docs ? d_doc.get() : nullptr, s.B, s.T, s.C, s.NH, this->gpu);
      const std::vector<S> got = d_dqkv.host();
      EXPECT_TRUE(close(got, dqkv, this->tol_of(tol::kFlashBwd))) << "dqkv";
      EXPECT_TRUE(same_bits(got, d_dqkv2.host())) << "two identical backward calls gave different bits";
    }
  }
}

TYPED_TEST(CudaAttention, FlashAndMaterialisedPathsAgreeOnTheGpu) {
  using S = TypeParam;
  for (const AttnShape& s : {AttnShape{2, 70, 64, 2}, AttnShape{1, 130, 96, 2}}) {
    for (bool docs : {false, true}) {
      SCOPED_TRACE(label(s, docs));
      auto qkv = this->values(size_t(s.B) * s.T * 3 * s.C, -2.f, 2.f);
      auto doc = random_docs(s.B, s.T, this->rng);
      const size_t nout = size_t(s.B) * s.T * s.C, natt = size_t(s.B) * s.NH * s.T * s.T;
      DeviceArray<S> d_qkv(qkv), d_out(this->values(nout)), d_flash(this->values(nout)), d_att(this->values(natt));
      DeviceArray<float> d_lse(random_floats(size_t(s.B) * s.NH * s.T, this->rng));
      DeviceArray<int32_t> d_doc(doc);
      const int32_t* gdoc = docs ? d_doc.get() : nullptr;
      mt::cuda::attention_fwd<S>(d_out.get(), d_att.get(), d_qkv.get(), gdoc, s.B, s.T, s.C, s.NH, this->gpu);
      mt::cuda::flash_attention_fwd<S>(d_flash.get(), d_lse.get(), d_qkv.get(), gdoc, s.B, s.T, s.C, s.NH, this->gpu);
      // The materialised path multiplies V by the stored (rounded) probabilities, the flash path by fp32 ones.
      EXPECT_TRUE(close(d_flash.host(), d_out.host(), this->tol_of(tol::kAttentionFwd))) << "out";
    }
  }
}

// Flash attention's argument checks come before any device work, so they hold on every machine.
TEST(CudaFlashAttention, RejectsHeadSizesAboveItsLimitNamingTheLimit) {
  const mt::ops::Ctx gpu{mt::Device::cuda, nullptr};
  try {
    mt::cuda::flash_attention_fwd<float>(nullptr, nullptr, nullptr, nullptr, 1, 4, 2 * 129, 2, gpu);
    FAIL() << "a head size of 129 was accepted";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("limit of 128"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mt::cuda::flash_attention_bwd<bf16>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4,
                                                   10, 3, gpu),
               mt::Error);  // C = 10 is not divisible by NH = 3
}

}  // namespace
