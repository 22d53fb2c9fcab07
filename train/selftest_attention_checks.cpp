// The attention checks of `minitrain selftest`: the materialised path (attention_fwd/bwd) and the flash
// path (flash_attention_fwd/bwd), each against its CPU twin, causal and document-masked, in f32, bf16
// and (at the small shapes) f16. Each backward is compared on its own: both backends start from the
// CPU forward's saved tensors (att, or out and lse). Before the flash checks, the tensor-core fragment
// probe (kernels/cuda/fragment_probe_kernels.cuh) compares the instructions the tensor-core flash
// kernels stand on with the PTX ISA's fragment tables, bit for bit.
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/tolerances.h"
#include "kernels/ops.h"
#include "runtime/check.h"
#include "train/selftest_checker.h"

#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/fragment_probe.h"

namespace mt::train::selftest_detail {
namespace {

namespace tol = ::mt::cuda::tol;  // kernels/cuda/tolerances.h

struct AttnShape { int B, T, C, NH; bool docs, big; };
// hs = C/NH = 4, 8 and 64; T odd, just past a warp, and GPT-2's 1024.
const AttnShape kAttnShapes[] = {{2, 7, 12, 3, false, false}, {3, 33, 40, 5, true, false},
                                 {1, 1024, 768, 12, false, true}};
// The flash kernels' tiles are 64 rows: T = 70 and 130 end in a partial tile, hs = 128 is their limit.
// In bf16/fp16 hs = 32 and 64 run the tensor-core kernels (flash_attention_mma.cu), hs = 128 their
// forward; at hs = 32 the forward's blocks are 128 rows (two row tiles per warp), so T = 200 gives a
// whole block and a partial one.
const AttnShape kFlashShapes[] = {{2, 7, 12, 3, false, false},  {3, 70, 40, 5, true, false},
                                  {3, 130, 128, 2, true, false}, {2, 130, 256, 2, true, false},
                                  {2, 200, 64, 2, false, false}, {1, 1024, 768, 12, false, true}};

std::string label(const AttnShape& s) {
  return strfmt("B=%d T=%d C=%d NH=%d%s", s.B, s.T, s.C, s.NH, s.docs ? " docs" : "");
}

// Which flash kernels a shape runs on the GPU, for the table.
template <class S>
std::string kernel_label(const AttnShape& s, bool backward) {
  return cuda::flash_attention_on_tensor_cores(dtype_of<S>(), s.C / s.NH, backward) ? " [tensor cores]" : " [SIMT]";
}

// The inputs of one shape: qkv, the document ids (nullptr when unmasked) on both sides.
template <class S>
struct AttnInputs {
  std::vector<S> qkv;
  std::vector<int32_t> doc;
  DeviceArray<S> d_qkv;
  DeviceArray<int32_t> d_doc;
  bool docs;
  AttnInputs(Checker& c, const AttnShape& s)
      : qkv(c.values<S>(size_t(s.B) * s.T * 3 * s.C, -2.f, 2.f)),
        doc(random_docs(c, s.B, s.T)),
        d_qkv(qkv),
        d_doc(doc),
        docs(s.docs) {}
  const int32_t* cpu_doc() const { return docs ? doc.data() : nullptr; }
  const int32_t* gpu_doc() const { return docs ? d_doc.get() : nullptr; }
};

template <class S>
void attention_fwd_check(Checker& c) {
  for (const AttnShape& s : kAttnShapes) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(label(s));
    AttnInputs<S> in(c, s);
    const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
    std::vector<S> out(size_t(s.B) * s.T * s.C), att(natt);
    cpu::attention_fwd<S>(out.data(), att.data(), in.qkv.data(), in.cpu_doc(), s.B, s.T, s.C, s.NH);
    DeviceArray<S> d_out(c.values<S>(out.size())), d_att(c.values<S>(natt));
    ops::attention_fwd(d_out.get(), d_att.get(), in.d_qkv.get(), in.gpu_doc(), s.B, s.T, s.C, s.NH, kGpu);
    const std::vector<S> got_att = d_att.host();
    c.rel("out", d_out.host(), out, tol::kAttentionFwd.of<S>());
    c.rel("att", got_att, att, tol::kAttentionFwd.of<S>());
    size_t leaked = 0;  // a masked-out pair must get exactly zero probability, not merely a small one
    for (size_t i = 0; i < natt; i++) leaked += load(att[i]) == 0.f && load(got_att[i]) != 0.f;
    c.count("att masked != 0", leaked);
  }
}

template <class S>
void attention_bwd_check(Checker& c) {
  for (const AttnShape& s : kAttnShapes) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(label(s));
    AttnInputs<S> in(c, s);
    const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
    std::vector<S> out(size_t(s.B) * s.T * s.C), att(natt), dqkv(in.qkv.size());
    cpu::attention_fwd<S>(out.data(), att.data(), in.qkv.data(), in.cpu_doc(), s.B, s.T, s.C, s.NH);
    auto dout = c.values<S>(out.size());
    std::vector<float> scratch(natt);
    cpu::attention_bwd<S>(dqkv.data(), scratch.data(), dout.data(), in.qkv.data(), att.data(), in.cpu_doc(), s.B,
                          s.T, s.C, s.NH);
    DeviceArray<S> d_att(att), d_dout(dout), d_dqkv(c.values<S>(dqkv.size()));
    DeviceArray<float> d_scratch(c.floats(natt));
    ops::attention_bwd(d_dqkv.get(), d_scratch.get(), d_dout.get(), in.d_qkv.get(), d_att.get(), in.gpu_doc(), s.B,
                       s.T, s.C, s.NH, kGpu);
    c.rel("dqkv", d_dqkv.host(), dqkv, tol::kAttentionBwd.of<S>());
  }
}

template <class S>
void flash_attention_fwd_check(Checker& c) {
  for (const AttnShape& s : kFlashShapes) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(label(s) + kernel_label<S>(s, false));
    AttnInputs<S> in(c, s);
    std::vector<S> out(size_t(s.B) * s.T * s.C);
    std::vector<float> lse(size_t(s.B) * s.NH * s.T);
    cpu::flash_attention_fwd<S>(out.data(), lse.data(), in.qkv.data(), in.cpu_doc(), s.B, s.T, s.C, s.NH);
    DeviceArray<S> d_out(c.values<S>(out.size()));
    DeviceArray<float> d_lse(c.floats(lse.size()));
    ops::flash_attention_fwd(d_out.get(), d_lse.get(), in.d_qkv.get(), in.gpu_doc(), s.B, s.T, s.C, s.NH, kGpu);
    c.rel("out", d_out.host(), out, tol::kFlashFwd.of<S>());
    c.rel("lse", d_lse.host(), lse, tol::kFlashLse.of<S>());
  }
}

template <class S>
void flash_attention_bwd_check(Checker& c) {
  for (const AttnShape& s : kFlashShapes) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(label(s) + kernel_label<S>(s, true));
    AttnInputs<S> in(c, s);
    std::vector<S> out(size_t(s.B) * s.T * s.C), dqkv(in.qkv.size());
    std::vector<float> lse(size_t(s.B) * s.NH * s.T), scratch(lse.size());
    cpu::flash_attention_fwd<S>(out.data(), lse.data(), in.qkv.data(), in.cpu_doc(), s.B, s.T, s.C, s.NH);
    auto dout = c.values<S>(out.size());
    cpu::flash_attention_bwd<S>(dqkv.data(), scratch.data(), dout.data(), in.qkv.data(), out.data(), lse.data(),
                                in.cpu_doc(), s.B, s.T, s.C, s.NH);
    DeviceArray<S> d_out(out), d_dout(dout), d_dqkv(c.values<S>(dqkv.size())), d_dqkv2(c.values<S>(dqkv.size()));
    DeviceArray<float> d_lse(lse), d_scratch(c.floats(scratch.size()));
    for (S* target : {d_dqkv.get(), d_dqkv2.get()})
      ops::flash_attention_bwd(target, d_scratch.get(), d_dout.get(), in.d_qkv.get(), d_out.get(), d_lse.get(),
                               in.gpu_doc(), s.B, s.T, s.C, s.NH, kGpu);
    const std::vector<S> got = d_dqkv.host();
    c.rel("dqkv", got, dqkv, tol::kFlashBwd.of<S>());
    // No atomics: a second identical call must give the same bits.
    c.bits("dqkv rerun", d_dqkv2.host(), got);
  }
}

template <class S>
void tensor_core_fragments_check(Checker& c) {
  c.at<S>("one warp, 16 x 16 tiles");
  const cuda::fragment_probe::Result r = cuda::fragment_probe::run(dtype_of<S>());
  c.bits("ldmatrix B frags", r.regs, r.regs_want);
  c.bits("mma B n-major", r.c_nmajor, r.c_want);
  c.bits("mma B k-major", r.c_kmajor, r.c_want);
  c.bits("cp.async + zfill", r.copied, r.copied_want);
}

}  // namespace

void check_tensor_core_fragments(Checker& c) {
  // Below compute capability 8.0 the flash kernels run on CUDA cores only: nothing to probe.
  if (!cuda::fragment_probe::supported()) return;
  tensor_core_fragments_check<bf16>(c);
  tensor_core_fragments_check<f16>(c);
}

#define MT_TYPED_ATTENTION_CHECK(name) \
  void check_##name(Checker& c) {      \
    name##_check<float>(c);            \
    name##_check<bf16>(c);             \
    name##_check<f16>(c);              \
  }
MT_TYPED_ATTENTION_CHECK(attention_fwd)
MT_TYPED_ATTENTION_CHECK(attention_bwd)
MT_TYPED_ATTENTION_CHECK(flash_attention_fwd)
MT_TYPED_ATTENTION_CHECK(flash_attention_bwd)
#undef MT_TYPED_ATTENTION_CHECK

}  // namespace mt::train::selftest_detail

#endif  // MT_HAVE_CUDA
