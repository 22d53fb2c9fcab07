// The op checks of `minitrain selftest` (see selftest.h): each runs one op of kernels/ops.h through the
// dispatcher with a CUDA context and through its CPU twin (mt::cpu) on the same inputs, and compares.
// Ops on activations run in every storage type: f32 and bf16 at every shape, f16 at the small ones;
// a 16-bit check draws fp32 values, rounds them to S once, and gives both backends those S values
// (the CPU twin is its S instantiation). The attention checks are in selftest_attention_checks.cpp.
//
// Outputs an op assigns start as random garbage on the device, so a kernel that skips an element
// fails; outputs it accumulates into (+=) start from the same random values on both backends, so `=`
// in place of `+=` fails too. Shapes: a small odd one, a prime or unaligned one, and a GPT-2 (124M)
// one (N = B*T = 1024 rows, C = 768, 4C = 3072, 12 heads, vocabulary 50257 padded to 50304).
#include <cmath>
#include <cstring>
#include <random>

#include "cli/selftest.h"
#include "cli/selftest_checker.h"
#include "kernels/clip_coefficient.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/tolerances.h"
#include "kernels/cuda_available.h"
#include "kernels/ops.h"
#include "runtime/check.h"
#include "runtime/dtype.h"

// Every check, in run order: one per op of kernels/ops.h (with the tensor-core fragment probe before
// the flash kernels), then one whole training step (selftest_train_check.cpp).
#define MT_SELFTEST_CHECKS(X)                                                                                    \
  X(encoder_fwd) X(encoder_bwd) X(layernorm_fwd) X(residual_layernorm_fwd) X(layernorm_bwd) X(matmul_fwd)        \
  X(matmul_bwd) X(gelu_fwd) X(gelu_bwd) X(attention_fwd) X(attention_bwd) X(tensor_core_fragments)              \
  X(flash_attention_fwd) X(flash_attention_bwd) X(flash_block) X(add) X(softmax_xent) X(convert) X(scale) X(adamw) X(sum_squares) X(round_to)          \
  X(all_finite) X(train_step)

namespace mt::cli {

std::vector<std::string> selftest_check_names() {
#define MT_NAME(n) #n,
  return {MT_SELFTEST_CHECKS(MT_NAME)};
#undef MT_NAME
}

#ifndef MT_HAVE_CUDA

std::vector<OpCheckResult> run_op_check(const std::string&, uint64_t, bool) {
  fail("selftest: this build has no CUDA backend; configure with -DMT_CUDA=ON");
}

#else

namespace selftest_detail {
namespace {

namespace tol = ::mt::cuda::tol;  // kernels/cuda/tolerances.h

// A check run in all three storage types: name_check<S> does the work.
#define MT_TYPED_CHECK(name)            \
  void check_##name(Checker& c) {       \
    name##_check<float>(c);             \
    name##_check<bf16>(c);              \
    name##_check<f16>(c);               \
  }

struct EncShape { int B, T, C, V; bool pos, big; };
std::string label(const EncShape& s) {
  return strfmt("B=%d T=%d C=%d V=%d%s", s.B, s.T, s.C, s.V, s.pos ? " pos" : "");
}

template <class S>
void encoder_fwd_check(Checker& c) {
  for (EncShape s : {EncShape{2, 7, 13, 11, false, false}, EncShape{3, 33, 97, 257, true, false},
                     EncShape{1, 1024, 768, 50304, false, true}}) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(label(s));
    const int maxT = s.T + 3;
    auto tokens = c.ints(size_t(s.B) * s.T, 0, s.V - 1), pos = c.ints(tokens.size(), 0, maxT - 1);
    auto wte = c.values<S>(size_t(s.V) * s.C), wpe = c.values<S>(size_t(maxT) * s.C);
    std::vector<S> want(tokens.size() * size_t(s.C));
    cpu::encoder_fwd<S>(want.data(), tokens.data(), s.pos ? pos.data() : nullptr, wte.data(), wpe.data(), s.B, s.T,
                        s.C);
    DeviceArray<int32_t> d_tok(tokens), d_pos(pos);
    DeviceArray<S> d_wte(wte), d_wpe(wpe), d_out(c.values<S>(want.size()));
    ops::encoder_fwd(d_out.get(), d_tok.get(), s.pos ? d_pos.get() : nullptr, d_wte.get(), d_wpe.get(), s.B, s.T,
                     s.C, kGpu);
    c.rel("out", d_out.host(), want, tol::kExact.of<S>());
  }
}
MT_TYPED_CHECK(encoder_fwd)

template <class S>
void encoder_bwd_check(Checker& c) {
  // A vocabulary of 3 forces many repeated tokens; C = 300 spans two column tiles.
  for (EncShape s : {EncShape{2, 7, 13, 3, false, false}, EncShape{3, 37, 300, 17, true, false},
                     EncShape{1, 1024, 768, 50304, false, true}}) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(label(s));
    const int maxT = s.T + 2;
    auto tokens = c.ints(size_t(s.B) * s.T, 0, s.V - 1), pos = c.ints(tokens.size(), 0, maxT - 1);
    auto dout = c.values<S>(tokens.size() * size_t(s.C));
    auto dwte = c.floats(size_t(s.V) * s.C), dwpe = c.floats(size_t(maxT) * s.C);
    DeviceArray<int32_t> d_tok(tokens), d_pos(pos);
    DeviceArray<S> d_dout(dout);
    DeviceArray<float> d_dwte(dwte), d_dwpe(dwpe), d_dwte2(dwte), d_dwpe2(dwpe);
    cpu::encoder_bwd<S>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.pos ? pos.data() : nullptr, s.B, s.T,
                        s.C);
    const int32_t* gpos = s.pos ? d_pos.get() : nullptr;
    ops::encoder_bwd(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tok.get(), gpos, s.B, s.T, s.C, kGpu);
    ops::encoder_bwd(d_dwte2.get(), d_dwpe2.get(), d_dout.get(), d_tok.get(), gpos, s.B, s.T, s.C, kGpu);
    auto got_wte = d_dwte.host(), got_wpe = d_dwpe.host();
    c.rel("dwte", got_wte, dwte, tol::kEncoderBwd.of<S>());
    c.rel("dwpe", got_wpe, dwpe, tol::kEncoderBwd.of<S>());
    // No float atomics: a second identical call must give the same bits.
    c.bits("dwte rerun", d_dwte2.host(), got_wte);
  }
}
MT_TYPED_CHECK(encoder_bwd)

struct RowShape { int N, C; bool flag, big; };

template <class S>
void layernorm_fwd_check(Checker& c) {
  // flag: with bias.
  for (RowShape s : {RowShape{3, 7, true, false}, RowShape{17, 1031, false, false}, RowShape{1024, 768, true, true}}) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(strfmt("N=%d C=%d%s", s.N, s.C, s.flag ? "" : " no-bias"));
    auto inp = c.values<S>(size_t(s.N) * s.C, 2.f, 5.f);  // a large mean tests the two-pass variance
    auto w = c.values<S>(size_t(s.C)), b = c.values<S>(size_t(s.C));
    std::vector<S> out(inp.size());
    std::vector<float> mean(size_t(s.N)), rstd(size_t(s.N));
    cpu::layernorm_fwd<S>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), s.flag ? b.data() : nullptr,
                          s.N, s.C);
    DeviceArray<S> d_inp(inp), d_w(w), d_b(b), d_out(c.values<S>(out.size()));
    DeviceArray<float> d_mean(c.floats(mean.size())), d_rstd(c.floats(rstd.size()));
    ops::layernorm_fwd(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(), s.flag ? d_b.get() : nullptr,
                       s.N, s.C, kGpu);
    c.rel("out", d_out.host(), out, tol::kLayerNorm.of<S>());
    c.rel("mean", d_mean.host(), mean, tol::kLayerNormStats.of<S>());
    c.rel("rstd", d_rstd.host(), rstd, tol::kLayerNormStats.of<S>());
  }
}
MT_TYPED_CHECK(layernorm_fwd)

template <class S>
void residual_layernorm_fwd_check(Checker& c) {
  // flag: res written over a (in place), as the model's residual stream does.
  for (RowShape s : {RowShape{3, 7, false, false}, RowShape{17, 1031, true, false}, RowShape{1024, 768, true, true}}) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(strfmt("N=%d C=%d%s", s.N, s.C, s.flag ? " in-place" : ""));
    auto a = c.values<S>(size_t(s.N) * s.C, -2.f, 2.f), b = c.values<S>(a.size(), 1.f, 4.f);
    auto w = c.values<S>(size_t(s.C)), bias = c.values<S>(size_t(s.C));
    std::vector<S> res(a.size()), out(a.size());
    std::vector<float> mean(size_t(s.N)), rstd(size_t(s.N));
    cpu::residual_layernorm_fwd<S>(res.data(), out.data(), mean.data(), rstd.data(), a.data(), b.data(), w.data(),
                                   bias.data(), s.N, s.C);
    DeviceArray<S> d_a(a), d_b(b), d_w(w), d_bias(bias), d_res(c.values<S>(a.size())), d_out(c.values<S>(a.size()));
    DeviceArray<float> d_mean(c.floats(mean.size())), d_rstd(c.floats(rstd.size()));
    S* g_res = s.flag ? d_a.get() : d_res.get();
    ops::residual_layernorm_fwd(g_res, d_out.get(), d_mean.get(), d_rstd.get(), d_a.get(), d_b.get(), d_w.get(),
                                d_bias.get(), s.N, s.C, kGpu);
    c.rel("res", s.flag ? d_a.host() : d_res.host(), res, tol::kExact.of<S>());
    c.rel("out", d_out.host(), out, tol::kLayerNorm.of<S>());
    c.rel("mean", d_mean.host(), mean, tol::kLayerNormStats.of<S>());
    c.rel("rstd", d_rstd.host(), rstd, tol::kLayerNormStats.of<S>());
  }
}
MT_TYPED_CHECK(residual_layernorm_fwd)

template <class S>
void layernorm_bwd_check(Checker& c) {
  // flag: accumulate into dinp (the residual gradient), else assign.
  for (RowShape s : {RowShape{3, 7, false, false}, RowShape{37, 1031, true, false}, RowShape{1024, 768, true, true}}) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(strfmt("N=%d C=%d%s", s.N, s.C, s.flag ? " accumulate" : ""));
    auto inp = c.values<S>(size_t(s.N) * s.C, -2.f, 3.f), dout = c.values<S>(inp.size());
    auto w = c.values<S>(size_t(s.C)), b = c.values<S>(size_t(s.C));
    std::vector<S> out(inp.size());
    std::vector<float> mean(size_t(s.N)), rstd(size_t(s.N));
    cpu::layernorm_fwd<S>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), s.N, s.C);
    auto dw = c.floats(size_t(s.C)), db = c.floats(size_t(s.C));
    auto dinp = c.values<S>(inp.size());  // the residual gradient, or garbage to be overwritten
    DeviceArray<S> d_inp(inp), d_w(w), d_dout(dout), d_dinp(dinp);
    DeviceArray<float> d_mean(mean), d_rstd(rstd), d_dw(dw), d_db(db);
    cpu::layernorm_bwd<S>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                          rstd.data(), s.N, s.C, s.flag);
    ops::layernorm_bwd(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(), d_mean.get(),
                       d_rstd.get(), s.N, s.C, s.flag, kGpu);
    c.rel("dinp", d_dinp.host(), dinp, tol::kLayerNorm.of<S>());
    c.rel("dweight", d_dw.host(), dw, tol::kLayerNormParamGrads.of<S>());
    c.rel("dbias", d_db.host(), db, tol::kLayerNormParamGrads.of<S>());
  }
}
MT_TYPED_CHECK(layernorm_bwd)

struct MatShape { int N, IC, OC; bool flag; int offset; bool gelu, big, residual = false; };

template <class S>
void matmul_fwd_check(Checker& c) {
  // flag: with bias. offset 1 leaves every device pointer only element-aligned. gelu: the fused GELU
  // epilogue; OC = 37 is not a multiple of 8, which cuBLASLt's aux matrix needs (the unfused path).
  // residual: added as the GEMM's C (the MLP's output projection, 3072 -> 768 in gpt2).
  for (MatShape s : {MatShape{7, 13, 5, true, 0, false, false}, MatShape{37, 101, 53, false, 1, false, false},
                     MatShape{19, 64, 40, true, 0, true, false}, MatShape{23, 29, 37, true, 1, true, false},
                     MatShape{29, 31, 17, true, 1, false, false, true}, MatShape{1024, 768, 2304, true, 0, false, true},
                     MatShape{1024, 768, 3072, true, 0, true, true}, MatShape{1024, 3072, 768, true, 0, false, true, true}}) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(strfmt("N=%d IC=%d OC=%d%s%s%s%s", s.N, s.IC, s.OC, s.flag ? " bias" : "", s.gelu ? " gelu" : "",
                   s.residual ? " residual" : "", s.offset ? " unaligned" : ""));
    const int o = s.offset;
    const size_t nout = size_t(s.N) * s.OC;
    auto inp = c.values<S>(size_t(s.N) * s.IC + 1), w = c.values<S>(size_t(s.OC) * s.IC + 1);
    auto b = c.values<S>(size_t(s.OC) + 1), res = c.values<S>(nout + 1);
    std::vector<S> want(nout), want_pre(nout);
    cpu::matmul_fwd<S>(want.data(), inp.data() + o, w.data() + o, s.flag ? b.data() + o : nullptr, s.N, s.IC, s.OC,
                       s.gelu ? want_pre.data() : nullptr, s.residual ? res.data() + o : nullptr);
    DeviceArray<S> d_inp(inp), d_w(w), d_b(b), d_res(res), d_out(c.values<S>(nout + 1)), d_pre(c.values<S>(nout + 1));
    ops::matmul_fwd(d_out.get() + o, d_inp.get() + o, d_w.get() + o, s.flag ? d_b.get() + o : nullptr, s.N, s.IC,
                    s.OC, kGpu, s.gelu ? d_pre.get() + o : nullptr, s.residual ? d_res.get() + o : nullptr);
    auto window = [&](std::vector<S> v) { return std::vector<S>(v.begin() + o, v.begin() + o + long(nout)); };
    c.rel("out", window(d_out.host()), want, (s.gelu ? tol::kMatmulGelu : tol::kMatmul).of<S>());
    if (s.gelu) c.rel("pre_gelu", window(d_pre.host()), want_pre, tol::kMatmul.of<S>());
  }
}
MT_TYPED_CHECK(matmul_fwd)

template <class S>
void matmul_bwd_check(Checker& c) {
  // flag: all three gradients; without it dinp and dbias are skipped (nullptr), as for a first layer.
  // gelu: dinp through the fused GELU backward (IC = 37: the unfused path).
  for (MatShape s : {MatShape{7, 13, 5, true, 0, false, false}, MatShape{37, 101, 53, false, 0, false, false},
                     MatShape{19, 40, 24, true, 0, true, false}, MatShape{23, 37, 29, true, 0, true, false},
                     MatShape{1024, 3072, 768, true, 0, true, true}}) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(strfmt("N=%d IC=%d OC=%d%s%s", s.N, s.IC, s.OC, s.flag ? "" : " dweight-only", s.gelu ? " gelu" : ""));
    auto inp = c.values<S>(size_t(s.N) * s.IC), w = c.values<S>(size_t(s.OC) * s.IC);
    auto dout = c.values<S>(size_t(s.N) * s.OC), pre = c.values<S>(inp.size(), -3.f, 3.f);
    auto dw = c.floats(w.size()), db = c.floats(size_t(s.OC));
    std::vector<S> dinp(inp.size());
    DeviceArray<S> d_inp(inp), d_w(w), d_dout(dout), d_pre(pre), d_dinp(c.values<S>(dinp.size()));
    DeviceArray<float> d_dw(dw), d_db(db);
    cpu::matmul_bwd<S>(s.flag ? dinp.data() : nullptr, dw.data(), s.flag ? db.data() : nullptr, dout.data(),
                       inp.data(), w.data(), s.N, s.IC, s.OC, s.gelu ? pre.data() : nullptr);
    ops::matmul_bwd(s.flag ? d_dinp.get() : nullptr, d_dw.get(), s.flag ? d_db.get() : nullptr, d_dout.get(),
                    d_inp.get(), d_w.get(), s.N, s.IC, s.OC, kGpu, s.gelu ? d_pre.get() : nullptr);
    if (s.flag) c.rel("dinp", d_dinp.host(), dinp, (s.gelu ? tol::kMatmulGelu : tol::kMatmul).of<S>());
    c.rel("dweight", d_dw.host(), dw, tol::kMatmulParamGrads.of<S>());
    c.rel(s.flag ? "dbias" : "dbias untouched", d_db.host(), db, tol::kMatmulParamGrads.of<S>());
  }
}
MT_TYPED_CHECK(matmul_bwd)

template <class S>
void gelu_check(Checker& c, bool backward) {
  for (int64_t n : {int64_t(7), int64_t(100003), int64_t(1024) * 3072}) {
    if (!runs_at<S>(n > 100003)) continue;
    c.at<S>(strfmt("N=%lld", (long long)n));
    auto inp = c.values<S>(size_t(n), -6.f, 6.f), dout = c.values<S>(size_t(n));
    std::vector<S> want(inp.size());
    DeviceArray<S> d_inp(inp), d_dout(dout), d_res(c.values<S>(want.size()));
    if (backward) {
      cpu::gelu_bwd<S>(want.data(), dout.data(), inp.data(), n);
      ops::gelu_bwd(d_res.get(), d_dout.get(), d_inp.get(), n, kGpu);
    } else {
      cpu::gelu_fwd<S>(want.data(), inp.data(), n);
      ops::gelu_fwd(d_res.get(), d_inp.get(), n, kGpu);
    }
    c.rel(backward ? "dinp" : "out", d_res.host(), want, tol::kGelu.of<S>());
  }
}
template <class S>
void gelu_fwd_check(Checker& c) {
  gelu_check<S>(c, false);
}
template <class S>
void gelu_bwd_check(Checker& c) {
  gelu_check<S>(c, true);
}
MT_TYPED_CHECK(gelu_fwd)
MT_TYPED_CHECK(gelu_bwd)

template <class S>
void add_check(Checker& c) {
  for (int64_t n : {int64_t(31), int64_t(100003), int64_t(1024) * 768}) {
    if (!runs_at<S>(n > 100003)) continue;
    const bool in_place = n == 100003;  // out aliases a
    c.at<S>(strfmt("N=%lld%s", (long long)n, in_place ? " in-place" : ""));
    auto a = c.values<S>(size_t(n)), b = c.values<S>(size_t(n));
    std::vector<S> want(a.size());
    cpu::add<S>(want.data(), a.data(), b.data(), n);
    DeviceArray<S> d_a(a), d_b(b), d_out(c.values<S>(a.size()));
    ops::add(in_place ? d_a.get() : d_out.get(), d_a.get(), d_b.get(), n, kGpu);
    c.rel("out", in_place ? d_a.host() : d_out.host(), want, tol::kExact.of<S>());
  }
}
MT_TYPED_CHECK(add)

template <class S>
void softmax_xent_check(Checker& c) {
  struct Shape { int N, V, Vp; int mode; bool big; };  // mode 0: separate dlogits, 1: in place, 2: losses only
  for (Shape s : {Shape{5, 7, 8, 0, false}, Shape{13, 101, 128, 1, false}, Shape{9, 1009, 1024, 2, false},
                  Shape{1024, 50257, 50304, 0, true}}) {
    if (!runs_at<S>(s.big)) continue;
    c.at<S>(strfmt("N=%d V=%d Vp=%d%s", s.N, s.V, s.Vp, s.mode == 1 ? " in-place" : s.mode == 2 ? " loss-only" : ""));
    auto logits = c.values<S>(size_t(s.N) * s.Vp, -8.f, 8.f);
    auto targets = c.ints(size_t(s.N), 0, s.V - 1);
    for (size_t i = 1; i < targets.size(); i += 3) targets[i] = -1;  // ignored rows
    const float dloss = 1.f / float(s.N);
    std::vector<float> losses(size_t(s.N));
    std::vector<S> dlogits(s.mode == 2 ? 0 : logits.size());
    DeviceArray<S> d_logits(logits), d_dlogits(c.values<S>(dlogits.size()));
    DeviceArray<float> d_losses(c.floats(losses.size()));
    DeviceArray<int32_t> d_targets(targets);
    cpu::softmax_xent<S>(losses.data(), s.mode == 2 ? nullptr : dlogits.data(), logits.data(), targets.data(), dloss,
                         s.N, s.V, s.Vp);
    S* grad = s.mode == 0 ? d_dlogits.get() : s.mode == 1 ? d_logits.get() : nullptr;
    ops::softmax_xent(d_losses.get(), grad, d_logits.get(), d_targets.get(), dloss, s.N, s.V, s.Vp, kGpu);
    c.rel("losses", d_losses.host(), losses, tol::kSoftmaxXentLoss.of<S>());
    if (s.mode != 2)
      c.rel("dlogits", s.mode == 0 ? d_dlogits.host() : d_logits.host(), dlogits, tol::kSoftmaxXentGrad.of<S>());
  }
}
MT_TYPED_CHECK(softmax_xent)

// fp32 -> S over every kind of value (as round_to), S -> fp32 over every one of the 65536 bit patterns,
// and the fp32 copy: all bit-identical to the CPU.
template <class S>
void convert_check(Checker& c, const std::vector<float>& x) {
  const char* name = dtype_name(dtype_of<S>());
  {
    c.at(strfmt("N=%zu", x.size()), strfmt("f32->%s", name));
    std::vector<S> want(x.size());
    cpu::convert<S, float>(want.data(), x.data(), int64_t(x.size()));
    DeviceArray<float> d_x(x);
    DeviceArray<S> d_out(c.values<S>(x.size()));
    ops::convert(d_out.get(), d_x.get(), int64_t(x.size()), kGpu);
    c.bits("bits differ", d_out.host(), want);
  }
  std::vector<S> all(65536);
  for (size_t i = 0; i < all.size(); i++) all[i].bits = uint16_t(i);
  c.at(strfmt("N=%zu", all.size()), strfmt("%s->f32", name));
  std::vector<float> want(all.size());
  cpu::convert<float, S>(want.data(), all.data(), int64_t(all.size()));
  DeviceArray<S> d_all(all);
  DeviceArray<float> d_out(c.floats(all.size()));
  ops::convert(d_out.get(), d_all.get(), int64_t(all.size()), kGpu);
  c.bits("bits differ", d_out.host(), want);
}

// Uniform random bit patterns cover every exponent: NaNs, infinities, fp32 subnormals, values that
// round into fp16 subnormals or overflow to inf. The fixed list adds exact ties and boundaries.
std::vector<float> every_kind_of_float(Checker& c) {
  std::vector<float> x = {0.f, -0.f, 1.f, -1.f, INFINITY, -INFINITY, NAN, 65504.f, 65519.f, 65520.f, -65520.f,
                          6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f, 8.940697e-08f, 1.00390625f, 1.01171875f,
                          1.0009765625f, 3.4e38f};
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; i++) x.push_back(f32_from_bits(bits(c.rng)));
  return x;
}

void check_convert(Checker& c) {
  const std::vector<float> x = every_kind_of_float(c);
  convert_check<bf16>(c, x);
  convert_check<f16>(c, x);
  c.at(strfmt("N=%zu", x.size()), "f32->f32");
  DeviceArray<float> d_x(x), d_out(c.floats(x.size()));
  ops::convert(d_out.get(), d_x.get(), int64_t(x.size()), kGpu);
  c.bits("bits differ", d_out.host(), x);
}

const int64_t kElementwiseSizes[] = {31, 100003, 1024 * 768};

void check_scale(Checker& c) {
  for (int64_t n : kElementwiseSizes) {
    c.at(strfmt("N=%lld", (long long)n), "f32");
    auto x = c.floats(size_t(n));
    const float s = std::uniform_real_distribution<float>(-4.f, 4.f)(c.rng);
    DeviceArray<float> d_x(x);
    cpu::scale<float>(x.data(), s, n);
    ops::scale(d_x.get(), s, n, kGpu);
    c.rel("x", d_x.host(), x, tol::kExact.f32);
  }
}

void check_adamw(Checker& c) {
  for (int64_t n : {int64_t(1001), int64_t(65537), int64_t(1000003)}) {
    const int t = std::uniform_int_distribution<int>(1, 1000)(c.rng);
    c.at(strfmt("N=%lld t=%d", (long long)n, t), "f32");
    auto p = c.floats(size_t(n)), g = c.floats(size_t(n));
    auto m = c.floats(size_t(n), -0.1f, 0.1f), v = c.floats(size_t(n), 0.f, 0.01f);
    // The trainer's form: the gradients multiplied by a factor in device memory (unscale and clip).
    const float scale = c.floats(1, 0.1f, 1.f)[0];
    DeviceArray<float> d_p(p), d_m(m), d_v(v), d_g(g), d_scale(std::vector<float>{scale});
    cpu::adamw<float>(p.data(), m.data(), v.data(), g.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t, &scale);
    ops::adamw(d_p.get(), d_m.get(), d_v.get(), d_g.get(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t, kGpu, d_scale.get());
    c.rel("params", d_p.host(), p, tol::kAdamW);
    c.rel("m", d_m.host(), m, tol::kAdamW);
    c.rel("v", d_v.host(), v, tol::kAdamW);
  }
}

void check_sum_squares(Checker& c) {
  for (int64_t n : {int64_t(1), int64_t(4097), int64_t(1000003)}) {
    c.at(strfmt("N=%lld", (long long)n), "f32->f64");
    auto x = c.floats(size_t(n), -3.f, 3.f);
    DeviceArray<float> d_x(x);
    const double want = cpu::sum_squares<float>(x.data(), n);
    const double got = ops::sum_squares(d_x.get(), n, kGpu), again = ops::sum_squares(d_x.get(), n, kGpu);
    c.rel("sum", got, want, tol::kSumSquares);
    c.count("rerun differs", std::memcmp(&got, &again, sizeof got) != 0);
    // The trainer's form: the sum left in device memory (stored, then added to), and the clip factor
    // computed from it there.
    DeviceArray<double> d_sum(std::vector<double>{-1.0});
    DeviceArray<float> d_coef(std::vector<float>{-1.f});
    ops::sum_squares_into(d_sum.get(), d_x.get(), n, false, kGpu);
    ops::sum_squares_into(d_sum.get(), d_x.get(), n, true, kGpu);
    ops::clip_coefficient(d_coef.get(), d_sum.get(), 0.5, 1.0, kGpu);
    const double twice = d_sum.host()[0];
    c.count("into differs", twice != got + got);
    c.count("clip factor differs", d_coef.host()[0] != ops::clip_coefficient(twice, 0.5, 1.0));
  }
}

void check_round_to(Checker& c) {
  const std::vector<float> x = every_kind_of_float(c);
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    c.at(strfmt("N=%zu", x.size()), dtype_name(t));
    auto want = x;
    cpu::round_to(want.data(), int64_t(want.size()), int(t));
    DeviceArray<float> d_x(x);
    ops::round_to(d_x.get(), int64_t(x.size()), t, kGpu);
    c.bits("bits differ", d_x.host(), want);
  }
}

void check_all_finite(Checker& c) {
  for (int64_t n : {int64_t(257), int64_t(1000003)}) {
    c.at(strfmt("N=%lld", (long long)n), "f32");
    auto x = c.floats(size_t(n), -1e30f, 1e30f);
    size_t wrong = 0;
    {
      DeviceArray<float> d_x(x);
      wrong += !ops::all_finite(d_x.get(), n, kGpu);
    }
    for (float bad : {INFINITY, -INFINITY, NAN}) {  // one bad element at a random place
      auto y = x;
      y[c.index(y.size())] = bad;
      DeviceArray<float> d_y(y);
      wrong += ops::all_finite(d_y.get(), n, kGpu) != cpu::all_finite(y.data(), n);
    }
    c.count("wrong answers", wrong);
  }
}

#undef MT_TYPED_CHECK

}  // namespace
}  // namespace selftest_detail

std::vector<OpCheckResult> run_op_check(const std::string& name, uint64_t seed, bool perturb) {
  using namespace selftest_detail;
  using CheckFn = void (*)(Checker&);
  struct Entry { const char* name; CheckFn fn; };
#define MT_ENTRY(n) Entry{#n, check_##n},
  static const Entry table[] = {MT_SELFTEST_CHECKS(MT_ENTRY)};
#undef MT_ENTRY
  const Entry* e = nullptr;
  for (const Entry& t : table)
    if (name == t.name) e = &t;
  if (!e) fail("selftest: unknown op check '%s' (see `minitrain selftest --list`)", name.c_str());
  const std::string why = ops::cuda_unavailable_reason();
  if (!why.empty()) fail("selftest: %s", why.c_str());

  std::vector<OpCheckResult> results;
  Checker c(name, seed, perturb, results);
  try {
    e->fn(c);
  } catch (const std::exception& ex) {
    results.push_back(OpCheckResult{name, "(error)", c.shape(), c.dtype(), INFINITY, 0.0, false, "count", ex.what()});
  }
  return results;
}

#endif  // MT_HAVE_CUDA

}  // namespace mt::cli
