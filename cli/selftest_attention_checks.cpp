// The attention checks of `minitrain selftest`: the materialised path (attention_fwd/bwd) and the flash
// path (flash_attention_fwd/bwd), each against its CPU twin, causal and document-masked, in f32, bf16
// and (at the small shapes) f16. Each backward is compared on its own: both backends start from the
// CPU forward's saved tensors (att, or out and lse); ring attention's block kernels on zigzag pairs.
// Before the flash checks, the tensor-core fragment
// probe (kernels/cuda/fragment_probe_kernels.cuh) compares the instructions the tensor-core flash
// kernels stand on with the PTX ISA's fragment tables, bit for bit.
#include <string>
#include <vector>

#include "cli/selftest_checker.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/tolerances.h"
#include "kernels/ops.h"
#include "runtime/check.h"

#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/fragment_probe.h"

namespace mt::cli::selftest_detail {
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

// Ring attention's block kernels (kernels/cuda/flash_block.cu) on zigzag pairs of a cp=2 split (chunk
// c; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2): rank 0's own pair (the diagonal), and rank
// 0's queries over rank 1's keys, where chunk 0's queries see nothing (lse -inf). Forward, the merge
// of the two partial results, delta, and the backward adding to nonzero dq, dk, dv; all outputs fp32.
struct BlockShape { int B, chunk, C, NH; bool docs, big; };
const BlockShape kBlockShapes[] = {{2, 37, 40, 5, true, false}, {1, 512, 768, 12, true, true}};

template <class S>
void flash_block_check(Checker& c) {
  for (const BlockShape& s : kBlockShapes) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(strfmt("B=%d zigzag cp=2 chunk=%d C=%d NH=%d%s", s.B, s.chunk, s.C, s.NH, s.docs ? " docs" : ""));
    const int T = 4 * s.chunk, Tb = 2 * s.chunk, C = s.C, NH = s.NH;
    const std::vector<int32_t> seq_doc = random_docs(c, s.B, T);
    std::vector<int32_t> pos[2], doc[2];  // per rank: positions, and ids (B, Tb)
    for (int r = 0; r < 2; r++) {
      for (int part : {r, 3 - r})
        for (int t = 0; t < s.chunk; t++) pos[r].push_back(part * s.chunk + t);
      for (int b = 0; b < s.B; b++)
        for (int32_t p : pos[r]) doc[r].push_back(seq_doc[size_t(b) * T + p]);
    }
    const auto q = c.values<S>(size_t(s.B) * Tb * 3 * C, -2.f, 2.f);  // rank 0's qkv
    const auto kv = c.values<S>(size_t(s.B) * Tb * 2 * C, -2.f, 2.f);  // rank 1's travelling block
    const auto dout = c.values<S>(size_t(s.B) * Tb * C);
    const size_t n = size_t(s.B) * Tb * C, nl = size_t(s.B) * NH * Tb;
    DeviceArray<S> d_q(q), d_kv(kv), d_dout(dout);
    DeviceArray<int32_t> d_pos0(pos[0]), d_pos1(pos[1]), d_doc0(doc[0]), d_doc1(doc[1]);
    const int32_t* qd = s.docs ? doc[0].data() : nullptr;
    const int32_t* kd = s.docs ? doc[1].data() : nullptr;
    const int32_t* d_qd = s.docs ? d_doc0.get() : nullptr;
    const int32_t* d_kd = s.docs ? d_doc1.get() : nullptr;
    // Rank 0's step 0 (its own keys, the K and V of its qkv) and step 1 (rank 1's block), merged.
    std::vector<float> out(n), lse(nl), part(n), part_lse(nl);
    cpu::flash_block_fwd<S>(out.data(), lse.data(), q.data(), 3 * C, q.data() + C, q.data() + 2 * C, 3 * C,
                            pos[0].data(), pos[0].data(), qd, qd, s.B, Tb, Tb, C, NH);
    cpu::flash_block_fwd<S>(part.data(), part_lse.data(), q.data(), 3 * C, kv.data(), kv.data() + C, 2 * C,
                            pos[0].data(), pos[1].data(), qd, kd, s.B, Tb, Tb, C, NH);
    DeviceArray<float> d_out(c.floats(n)), d_lse(c.floats(nl)), d_part(c.floats(n)), d_part_lse(c.floats(nl));
    ops::flash_block_fwd(d_out.get(), d_lse.get(), d_q.get(), 3 * C, d_q.get() + C, d_q.get() + 2 * C, 3 * C,
                         d_pos0.get(), d_pos0.get(), d_qd, d_qd, s.B, Tb, Tb, C, NH, kGpu);
    ops::flash_block_fwd(d_part.get(), d_part_lse.get(), d_q.get(), 3 * C, d_kv.get(), d_kv.get() + C, 2 * C,
                         d_pos0.get(), d_pos1.get(), d_qd, d_kd, s.B, Tb, Tb, C, NH, kGpu);
    c.rel("out (diagonal)", d_out.host(), out, tol::kFlashFwd.f32);
    c.rel("out (other rank)", d_part.host(), part, tol::kFlashFwd.f32);
    // Compared on copies: the merge below needs part_lse's -inf rows as they are.
    std::vector<float> got_plse = d_part_lse.host(), want_plse = part_lse;
    size_t wrong_hidden = 0;  // queries that see nothing of the block: lse exactly -inf, on both sides
    for (size_t i = 0; i < nl; i++) {
      wrong_hidden += (got_plse[i] == -INFINITY) != (want_plse[i] == -INFINITY);
      if (want_plse[i] == -INFINITY) got_plse[i] = want_plse[i] = 0.f;
    }
    c.count("lse -inf rows differ", wrong_hidden);
    c.rel("lse (other rank)", got_plse, want_plse, tol::kFlashLse.f32);
    cpu::attention_merge<float>(out.data(), lse.data(), part.data(), part_lse.data(), s.B, Tb, C, NH);
    ops::attention_merge(d_out.get(), d_lse.get(), d_part.get(), d_part_lse.get(), s.B, Tb, C, NH, kGpu);
    c.rel("merged out", d_out.host(), out, tol::kFlashFwd.f32);
    c.rel("merged lse", d_lse.host(), lse, tol::kFlashLse.f32);
    // Backward of the other rank's pair with the merged (final) lse; delta from the rounded output.
    const std::vector<S> out_s = to_storage<S>(out);
    std::vector<float> delta(nl);
    cpu::attention_delta<S>(delta.data(), dout.data(), out_s.data(), s.B, Tb, C, NH);
    DeviceArray<S> d_out_s(out_s);
    DeviceArray<float> d_delta(c.floats(nl));
    ops::attention_delta(d_delta.get(), d_dout.get(), d_out_s.get(), s.B, Tb, C, NH, kGpu);
    c.rel("delta", d_delta.host(), delta, tol::kFlashBwd.f32);
    std::vector<float> dq = c.floats(n), dkv = c.floats(size_t(s.B) * Tb * 2 * C);
    DeviceArray<float> d_dq(dq), d_dkv(dkv), d_final_lse(lse), d_delta_ref(delta);
    cpu::flash_block_bwd<S>(dq.data(), dkv.data(), dkv.data() + C, 2 * C, dout.data(), q.data(), 3 * C, kv.data(),
                            kv.data() + C, 2 * C, lse.data(), delta.data(), pos[0].data(), pos[1].data(), qd, kd, s.B,
                            Tb, Tb, C, NH);
    ops::flash_block_bwd(d_dq.get(), d_dkv.get(), d_dkv.get() + C, 2 * C, d_dout.get(), d_q.get(), 3 * C, d_kv.get(),
                         d_kv.get() + C, 2 * C, d_final_lse.get(), d_delta_ref.get(), d_pos0.get(), d_pos1.get(), d_qd,
                         d_kd, s.B, Tb, Tb, C, NH, kGpu);
    c.rel("dq (added)", d_dq.host(), dq, tol::kFlashBwd.f32);
    c.rel("dk, dv (added)", d_dkv.host(), dkv, tol::kFlashBwd.f32);
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
MT_TYPED_ATTENTION_CHECK(flash_block)
#undef MT_TYPED_ATTENTION_CHECK

}  // namespace mt::cli::selftest_detail

#endif  // MT_HAVE_CUDA
