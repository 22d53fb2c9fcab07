// The op checks of `minitrain selftest` (see selftest.h): each runs one op of kernels/ops.h through the
// dispatcher with a CUDA context and through its CPU twin (mt::cpu) on the same inputs, and compares.
//
// Outputs an op assigns start as random garbage on the device, so a kernel that skips an element
// fails; outputs it accumulates into (+=) start from the same random values on both backends, so `=`
// in place of `+=` fails too. Shapes: a small odd one, a prime or unaligned one, and a GPT-2 (124M)
// one (N = B*T = 1024 rows, C = 768, 4C = 3072, 12 heads, vocabulary 50257 padded to 50304).
#include <array>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/tolerances.h"
#include "kernels/ops.h"
#include "runtime/check.h"
#include "runtime/dtype.h"
#include "train/selftest.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

// Every check, in run order: one per op of kernels/ops.h.
#define MT_SELFTEST_CHECKS(X)                                                                         \
  X(encoder_fwd) X(encoder_bwd) X(layernorm_fwd) X(layernorm_bwd) X(matmul_fwd) X(matmul_bwd)          \
  X(gelu_fwd) X(gelu_bwd) X(attention_fwd) X(attention_bwd) X(add) X(scale) X(softmax_xent) X(adamw) \
  X(sum_squares) X(round_to) X(all_finite)

namespace mt::train {

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

namespace {

namespace tol = ::mt::cuda::tol;  // kernels/cuda/tolerances.h

const ops::Ctx kGpu{Device::cuda, nullptr};

// A device copy of a host vector, freed on scope exit.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    p_ = static_cast<T*>(cuda::device_alloc(n_ * sizeof(T)));
    cuda::copy_to_device(p_, host.data(), n_ * sizeof(T));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  // A failed free is not thrown from here: whatever broke the device is reported by the check itself.
  ~DeviceArray() { try { cuda::device_free(p_); } catch (const Error&) {} }
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> v(n_);
    cuda::synchronize();
    cuda::copy_to_host(v.data(), p_, n_ * sizeof(T));
    return v;
  }

 private:
  size_t n_;
  T* p_ = nullptr;
};

// Draws the inputs of one check and records its comparisons.
class Checker {
 public:
  Checker(std::string op, uint64_t seed, bool perturb, std::vector<OpCheckResult>& out)
      : op_(std::move(op)), perturb_(perturb), out_(out) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the name: each check has its own stream
    for (char ch : op_) h = (h ^ uint8_t(ch)) * 1099511628211ull;
    std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(h), uint32_t(h >> 32)};
    rng.seed(seq);
    perturb_rng_.seed(seed ^ h);  // its own stream: perturbing changes no input
  }

  std::mt19937_64 rng;

  void at(std::string shape, std::string dtype = "f32") {
    shape_ = std::move(shape);
    dtype_ = std::move(dtype);
  }
  const std::string& shape() const { return shape_; }

  std::vector<float> floats(size_t n, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  }
  std::vector<int32_t> ints(size_t n, int lo, int hi) {
    std::uniform_int_distribution<int> d(lo, hi);
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = d(rng);
    return v;
  }
  size_t index(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

  // Max relative error of a device output against the CPU output.
  void rel(const char* output, std::vector<float> got, const std::vector<float>& want, double tolerance) {
    MT_CHECK(got.size() == want.size() && !want.empty(), "%s: %zu values vs %zu", output, got.size(), want.size());
    double num = 0, den = 1e-30;
    for (float w : want) den = std::max(den, double(std::fabs(w)));
    if (perturb_) got[perturb_index(got.size())] += float(0.01 * den);
    for (size_t i = 0; i < got.size(); i++) {
      const double d = std::fabs(double(got[i]) - double(want[i]));
      num = std::isnan(d) ? INFINITY : std::max(num, d);
      if (std::isinf(num)) break;
    }
    record(output, num / den, tolerance, "rel");
  }
  void rel(const char* output, double got, double want, double tolerance) {
    if (perturb_) got *= 1.001;
    const double err = std::fabs(got - want) / std::max(std::fabs(want), 1e-300);
    record(output, std::isnan(err) ? INFINITY : err, tolerance, "rel");
  }
  // Elements whose bit patterns differ (NaN payloads included).
  void bits(const char* output, std::vector<float> got, const std::vector<float>& want) {
    MT_CHECK(got.size() == want.size(), "%s: %zu values vs %zu", output, got.size(), want.size());
    const size_t k = perturb_ ? perturb_index(got.size()) : got.size();  // flip the lowest bit of one value
    if (k < got.size()) got[k] = f32_from_bits(f32_bits(got[k]) ^ 1u);
    size_t n = 0;
    for (size_t i = 0; i < got.size(); i++) n += f32_bits(got[i]) != f32_bits(want[i]);
    record(output, double(n), 0.0, "count");
  }
  // A count of wrong answers (must be zero).
  void count(const char* output, size_t wrong) { record(output, double(wrong + (perturb_ ? 1 : 0)), 0.0, "count"); }

 private:
  size_t perturb_index(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(perturb_rng_); }
  void record(const char* output, double err, double tolerance, const char* measure) {
    out_.push_back(OpCheckResult{op_, output, shape_, dtype_, err, tolerance, err <= tolerance, measure, ""});
  }
  std::string op_, shape_, dtype_ = "f32";
  bool perturb_;
  std::mt19937_64 perturb_rng_;
  std::vector<OpCheckResult>& out_;
};

// Packed documents: per batch row, ids 0, 1, 2, ... in runs of random length (possibly one token).
std::vector<int32_t> random_docs(Checker& c, int B, int T) {
  std::vector<int32_t> doc(size_t(B) * T);
  std::uniform_int_distribution<int> run(1, std::max(1, T / 3));
  for (int b = 0; b < B; b++) {
    int id = 0, left = run(c.rng);
    for (int t = 0; t < T; t++) {
      if (left-- == 0) id++, left = run(c.rng) - 1;
      doc[size_t(b) * T + t] = id;
    }
  }
  return doc;
}

struct EncShape { int B, T, C, V; bool pos; };
std::string label(const EncShape& s) {
  return strfmt("B=%d T=%d C=%d V=%d%s", s.B, s.T, s.C, s.V, s.pos ? " pos" : "");
}

void check_encoder_fwd(Checker& c) {
  for (EncShape s : {EncShape{2, 7, 13, 11, false}, EncShape{3, 33, 97, 257, true},
                     EncShape{1, 1024, 768, 50304, false}}) {
    c.at(label(s));
    const int maxT = s.T + 3;
    auto tokens = c.ints(size_t(s.B) * s.T, 0, s.V - 1), pos = c.ints(tokens.size(), 0, maxT - 1);
    auto wte = c.floats(size_t(s.V) * s.C), wpe = c.floats(size_t(maxT) * s.C);
    std::vector<float> want(tokens.size() * size_t(s.C));
    cpu::encoder_fwd<float>(want.data(), tokens.data(), s.pos ? pos.data() : nullptr, wte.data(), wpe.data(), s.B,
                            s.T, s.C);
    DeviceArray<int32_t> d_tok(tokens), d_pos(pos);
    DeviceArray<float> d_wte(wte), d_wpe(wpe), d_out(c.floats(want.size()));
    ops::encoder_fwd(d_out.get(), d_tok.get(), s.pos ? d_pos.get() : nullptr, d_wte.get(), d_wpe.get(), s.B, s.T,
                     s.C, kGpu);
    c.rel("out", d_out.host(), want, tol::kExact);
  }
}

void check_encoder_bwd(Checker& c) {
  // A vocabulary of 3 forces many repeated tokens; C = 300 spans two column tiles.
  for (EncShape s : {EncShape{2, 7, 13, 3, false}, EncShape{3, 37, 300, 17, true},
                     EncShape{1, 1024, 768, 50304, false}}) {
    c.at(label(s));
    const int maxT = s.T + 2;
    auto tokens = c.ints(size_t(s.B) * s.T, 0, s.V - 1), pos = c.ints(tokens.size(), 0, maxT - 1);
    auto dout = c.floats(tokens.size() * size_t(s.C));
    auto dwte = c.floats(size_t(s.V) * s.C), dwpe = c.floats(size_t(maxT) * s.C);
    DeviceArray<int32_t> d_tok(tokens), d_pos(pos);
    DeviceArray<float> d_dout(dout), d_dwte(dwte), d_dwpe(dwpe), d_dwte2(dwte), d_dwpe2(dwpe);
    cpu::encoder_bwd<float>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.pos ? pos.data() : nullptr, s.B,
                            s.T, s.C);
    const int32_t* gpos = s.pos ? d_pos.get() : nullptr;
    ops::encoder_bwd(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tok.get(), gpos, s.B, s.T, s.C, kGpu);
    ops::encoder_bwd(d_dwte2.get(), d_dwpe2.get(), d_dout.get(), d_tok.get(), gpos, s.B, s.T, s.C, kGpu);
    auto got_wte = d_dwte.host(), got_wpe = d_dwpe.host();
    c.rel("dwte", got_wte, dwte, tol::kEncoderBwd);
    c.rel("dwpe", got_wpe, dwpe, tol::kEncoderBwd);
    // No float atomics: a second identical call must give the same bits.
    c.bits("dwte rerun", d_dwte2.host(), got_wte);
  }
}

struct RowShape { int N, C; };

void check_layernorm_fwd(Checker& c) {
  for (RowShape s : {RowShape{3, 7}, RowShape{17, 1031}, RowShape{1024, 768}}) {
    const bool bias = s.N != 17;
    c.at(strfmt("N=%d C=%d%s", s.N, s.C, bias ? "" : " no-bias"));
    auto inp = c.floats(size_t(s.N) * s.C, 2.f, 5.f);  // a large mean tests the two-pass variance
    auto w = c.floats(size_t(s.C)), b = c.floats(size_t(s.C));
    std::vector<float> out(inp.size()), mean(size_t(s.N)), rstd(size_t(s.N));
    cpu::layernorm_fwd<float>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), bias ? b.data() : nullptr,
                              s.N, s.C);
    DeviceArray<float> d_inp(inp), d_w(w), d_b(b), d_out(c.floats(out.size())), d_mean(c.floats(mean.size())),
        d_rstd(c.floats(rstd.size()));
    ops::layernorm_fwd(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(), bias ? d_b.get() : nullptr,
                       s.N, s.C, kGpu);
    c.rel("out", d_out.host(), out, tol::kLayerNorm);
    c.rel("mean", d_mean.host(), mean, tol::kLayerNorm);
    c.rel("rstd", d_rstd.host(), rstd, tol::kLayerNorm);
  }
}

void check_layernorm_bwd(Checker& c) {
  for (RowShape s : {RowShape{3, 7}, RowShape{37, 1031}, RowShape{1024, 768}}) {
    c.at(strfmt("N=%d C=%d", s.N, s.C));
    auto inp = c.floats(size_t(s.N) * s.C, -2.f, 3.f), dout = c.floats(inp.size());
    auto w = c.floats(size_t(s.C)), b = c.floats(size_t(s.C));
    std::vector<float> out(inp.size()), mean(size_t(s.N)), rstd(size_t(s.N)), dinp(inp.size());
    cpu::layernorm_fwd<float>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), s.N, s.C);
    auto dw = c.floats(size_t(s.C)), db = c.floats(size_t(s.C));
    DeviceArray<float> d_inp(inp), d_w(w), d_dout(dout), d_mean(mean), d_rstd(rstd), d_dw(dw), d_db(db),
        d_dinp(c.floats(dinp.size()));
    cpu::layernorm_bwd<float>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                              rstd.data(), s.N, s.C);
    ops::layernorm_bwd(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(), d_mean.get(),
                       d_rstd.get(), s.N, s.C, kGpu);
    c.rel("dinp", d_dinp.host(), dinp, tol::kLayerNorm);
    c.rel("dweight", d_dw.host(), dw, tol::kLayerNorm);
    c.rel("dbias", d_db.host(), db, tol::kLayerNorm);
  }
}

struct MatShape { int N, IC, OC; bool flag; int offset; };

void check_matmul_fwd(Checker& c) {
  // flag: with bias. offset 1 leaves every device pointer only 4-byte aligned.
  for (MatShape s : {MatShape{7, 13, 5, true, 0}, MatShape{37, 101, 53, false, 1},
                     MatShape{1024, 768, 2304, true, 0}}) {
    c.at(strfmt("N=%d IC=%d OC=%d%s%s", s.N, s.IC, s.OC, s.flag ? " bias" : "", s.offset ? " unaligned" : ""));
    const int o = s.offset;
    auto inp = c.floats(size_t(s.N) * s.IC + 1), w = c.floats(size_t(s.OC) * s.IC + 1), b = c.floats(size_t(s.OC) + 1);
    std::vector<float> want(size_t(s.N) * s.OC);
    cpu::matmul_fwd<float>(want.data(), inp.data() + o, w.data() + o, s.flag ? b.data() + o : nullptr, s.N, s.IC,
                           s.OC);
    DeviceArray<float> d_inp(inp), d_w(w), d_b(b), d_out(c.floats(want.size() + 1));
    ops::matmul_fwd(d_out.get() + o, d_inp.get() + o, d_w.get() + o, s.flag ? d_b.get() + o : nullptr, s.N, s.IC,
                    s.OC, kGpu);
    auto got = d_out.host();
    got.erase(got.begin(), got.begin() + o);
    got.resize(want.size());
    c.rel("out", got, want, tol::kMatmul);
  }
}

void check_matmul_bwd(Checker& c) {
  // flag: all three gradients; without it dinp and dbias are skipped (nullptr), as for a first layer.
  for (MatShape s : {MatShape{7, 13, 5, true, 0}, MatShape{37, 101, 53, false, 0},
                     MatShape{1024, 3072, 768, true, 0}}) {
    c.at(strfmt("N=%d IC=%d OC=%d%s", s.N, s.IC, s.OC, s.flag ? "" : " dweight-only"));
    auto inp = c.floats(size_t(s.N) * s.IC), w = c.floats(size_t(s.OC) * s.IC), dout = c.floats(size_t(s.N) * s.OC);
    auto dw = c.floats(w.size()), db = c.floats(size_t(s.OC));
    std::vector<float> dinp(inp.size());
    DeviceArray<float> d_inp(inp), d_w(w), d_dout(dout), d_dw(dw), d_db(db), d_dinp(c.floats(dinp.size()));
    cpu::matmul_bwd<float>(s.flag ? dinp.data() : nullptr, dw.data(), s.flag ? db.data() : nullptr, dout.data(),
                           inp.data(), w.data(), s.N, s.IC, s.OC);
    ops::matmul_bwd(s.flag ? d_dinp.get() : nullptr, d_dw.get(), s.flag ? d_db.get() : nullptr, d_dout.get(),
                    d_inp.get(), d_w.get(), s.N, s.IC, s.OC, kGpu);
    if (s.flag) c.rel("dinp", d_dinp.host(), dinp, tol::kMatmul);
    c.rel("dweight", d_dw.host(), dw, tol::kMatmul);
    c.rel(s.flag ? "dbias" : "dbias untouched", d_db.host(), db, tol::kMatmul);
  }
}

void check_gelu(Checker& c, bool backward) {
  for (int64_t n : {int64_t(7), int64_t(100003), int64_t(1024) * 3072}) {
    c.at(strfmt("N=%lld", (long long)n));
    auto inp = c.floats(size_t(n), -6.f, 6.f), dout = c.floats(size_t(n));
    std::vector<float> want(inp.size());
    DeviceArray<float> d_inp(inp), d_dout(dout), d_res(c.floats(want.size()));
    if (backward) {
      cpu::gelu_bwd<float>(want.data(), dout.data(), inp.data(), n);
      ops::gelu_bwd(d_res.get(), d_dout.get(), d_inp.get(), n, kGpu);
    } else {
      cpu::gelu_fwd<float>(want.data(), inp.data(), n);
      ops::gelu_fwd(d_res.get(), d_inp.get(), n, kGpu);
    }
    c.rel(backward ? "dinp" : "out", d_res.host(), want, tol::kGelu);
  }
}
void check_gelu_fwd(Checker& c) { check_gelu(c, false); }
void check_gelu_bwd(Checker& c) { check_gelu(c, true); }

struct AttnShape { int B, T, C, NH; bool docs; };
// hs = C/NH from 4 down to 8 and 64; T odd, just past a warp, and GPT-2's 1024.
const AttnShape kAttnShapes[] = {{2, 7, 12, 3, false}, {3, 33, 40, 5, true}, {1, 1024, 768, 12, false}};

void check_attention(Checker& c, bool backward) {
  for (const AttnShape& s : kAttnShapes) {
    c.at(strfmt("B=%d T=%d C=%d NH=%d%s", s.B, s.T, s.C, s.NH, s.docs ? " docs" : ""));
    auto qkv = c.floats(size_t(s.B) * s.T * 3 * s.C, -2.f, 2.f);
    auto doc = random_docs(c, s.B, s.T);
    const int32_t* cdoc = s.docs ? doc.data() : nullptr;
    const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
    std::vector<float> out(size_t(s.B) * s.T * s.C), att(natt);
    cpu::attention_fwd<float>(out.data(), att.data(), qkv.data(), cdoc, s.B, s.T, s.C, s.NH);
    DeviceArray<float> d_qkv(qkv);
    DeviceArray<int32_t> d_doc(doc);
    const int32_t* gdoc = s.docs ? d_doc.get() : nullptr;
    if (!backward) {
      DeviceArray<float> d_out(c.floats(out.size())), d_att(c.floats(natt));
      ops::attention_fwd(d_out.get(), d_att.get(), d_qkv.get(), gdoc, s.B, s.T, s.C, s.NH, kGpu);
      auto got_att = d_att.host();
      c.rel("out", d_out.host(), out, tol::kAttentionFwd);
      c.rel("att", got_att, att, tol::kAttentionFwd);
      size_t leaked = 0;  // a masked-out pair must get exactly zero probability, not merely a small one
      for (size_t i = 0; i < natt; i++) leaked += att[i] == 0.f && got_att[i] != 0.f;
      c.count("att masked != 0", leaked);
      continue;
    }
    // Both backends start from the CPU's probabilities, so the backward is compared on its own.
    auto dout = c.floats(out.size());
    std::vector<float> scratch(natt), dqkv(qkv.size());
    cpu::attention_bwd<float>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), cdoc, s.B, s.T, s.C,
                              s.NH);
    DeviceArray<float> d_att(att), d_dout(dout), d_scratch(c.floats(natt)), d_dqkv(c.floats(qkv.size()));
    ops::attention_bwd(d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(), d_att.get(), gdoc, s.B, s.T, s.C,
                       s.NH, kGpu);
    c.rel("dqkv", d_dqkv.host(), dqkv, tol::kAttentionBwd);
  }
}
void check_attention_fwd(Checker& c) { check_attention(c, false); }
void check_attention_bwd(Checker& c) { check_attention(c, true); }

const int64_t kElementwiseSizes[] = {31, 100003, 1024 * 768};

void check_add(Checker& c) {
  for (int64_t n : kElementwiseSizes) {
    const bool in_place = n == 100003;  // out aliases a
    c.at(strfmt("N=%lld%s", (long long)n, in_place ? " in-place" : ""));
    auto a = c.floats(size_t(n)), b = c.floats(size_t(n));
    std::vector<float> want(a.size());
    cpu::add<float>(want.data(), a.data(), b.data(), n);
    DeviceArray<float> d_a(a), d_b(b), d_out(c.floats(a.size()));
    float* out = in_place ? d_a.get() : d_out.get();
    ops::add(out, d_a.get(), d_b.get(), n, kGpu);
    c.rel("out", in_place ? d_a.host() : d_out.host(), want, tol::kExact);
  }
}

void check_scale(Checker& c) {
  for (int64_t n : kElementwiseSizes) {
    c.at(strfmt("N=%lld", (long long)n));
    auto x = c.floats(size_t(n));
    const float s = std::uniform_real_distribution<float>(-4.f, 4.f)(c.rng);
    DeviceArray<float> d_x(x);
    cpu::scale<float>(x.data(), s, n);
    ops::scale(d_x.get(), s, n, kGpu);
    c.rel("x", d_x.host(), x, tol::kExact);
  }
}

void check_softmax_xent(Checker& c) {
  struct Shape { int N, V, Vp; int mode; };  // mode 0: separate dlogits, 1: in place, 2: losses only
  for (Shape s : {Shape{5, 7, 8, 0}, Shape{13, 101, 128, 1}, Shape{9, 1009, 1024, 2}, Shape{1024, 50257, 50304, 0}}) {
    c.at(strfmt("N=%d V=%d Vp=%d%s", s.N, s.V, s.Vp, s.mode == 1 ? " in-place" : s.mode == 2 ? " loss-only" : ""));
    auto logits = c.floats(size_t(s.N) * s.Vp, -8.f, 8.f);
    auto targets = c.ints(size_t(s.N), 0, s.V - 1);
    for (size_t i = 1; i < targets.size(); i += 3) targets[i] = -1;  // ignored rows
    const float dloss = 1.f / float(s.N);
    std::vector<float> losses(size_t(s.N)), dlogits(s.mode == 2 ? 0 : logits.size());
    DeviceArray<float> d_logits(logits), d_losses(c.floats(losses.size())), d_dlogits(c.floats(dlogits.size()));
    DeviceArray<int32_t> d_targets(targets);
    cpu::softmax_xent<float>(losses.data(), s.mode == 2 ? nullptr : dlogits.data(), logits.data(), targets.data(),
                             dloss, s.N, s.V, s.Vp);
    float* grad = s.mode == 0 ? d_dlogits.get() : s.mode == 1 ? d_logits.get() : nullptr;
    ops::softmax_xent(d_losses.get(), grad, d_logits.get(), d_targets.get(), dloss, s.N, s.V, s.Vp, kGpu);
    c.rel("losses", d_losses.host(), losses, tol::kSoftmaxXent);
    if (s.mode != 2) c.rel("dlogits", s.mode == 0 ? d_dlogits.host() : d_logits.host(), dlogits, tol::kSoftmaxXent);
  }
}

void check_adamw(Checker& c) {
  for (int64_t n : {int64_t(1001), int64_t(65537), int64_t(1000003)}) {
    const int t = std::uniform_int_distribution<int>(1, 1000)(c.rng);
    c.at(strfmt("N=%lld t=%d", (long long)n, t));
    auto p = c.floats(size_t(n)), g = c.floats(size_t(n));
    auto m = c.floats(size_t(n), -0.1f, 0.1f), v = c.floats(size_t(n), 0.f, 0.01f);
    DeviceArray<float> d_p(p), d_m(m), d_v(v), d_g(g);
    cpu::adamw<float>(p.data(), m.data(), v.data(), g.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    ops::adamw(d_p.get(), d_m.get(), d_v.get(), d_g.get(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t, kGpu);
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
  }
}

void check_round_to(Checker& c) {
  // Uniform random bit patterns cover every exponent: NaNs, infinities, fp32 subnormals, values that
  // round into fp16 subnormals or overflow to inf. The fixed list adds exact ties and boundaries.
  std::vector<float> x = {0.f, -0.f, 1.f, -1.f, INFINITY, -INFINITY, NAN, 65504.f, 65519.f, 65520.f, -65520.f,
                          6.1035156e-05f, 5.9604645e-08f, 2.9802322e-08f, 8.940697e-08f, 1.00390625f, 1.01171875f,
                          1.0009765625f, 3.4e38f};
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; i++) x.push_back(f32_from_bits(bits(c.rng)));
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
    c.at(strfmt("N=%lld", (long long)n));
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

}  // namespace

std::vector<OpCheckResult> run_op_check(const std::string& name, uint64_t seed, bool perturb) {
  using CheckFn = void (*)(Checker&);
  struct Entry { const char* name; CheckFn fn; };
#define MT_ENTRY(n) Entry{#n, check_##n},
  static const Entry table[] = {MT_SELFTEST_CHECKS(MT_ENTRY)};
#undef MT_ENTRY
  const Entry* e = nullptr;
  for (const Entry& t : table)
    if (name == t.name) e = &t;
  if (!e) fail("selftest: unknown op check '%s' (see `minitrain selftest --list`)", name.c_str());
  const std::string why = cuda_unavailable_reason();
  if (!why.empty()) fail("%s", why.c_str());

  std::vector<OpCheckResult> results;
  Checker c(name, seed, perturb, results);
  try {
    e->fn(c);
  } catch (const std::exception& ex) {
    results.push_back(OpCheckResult{name, "(error)", c.shape(), "f32", INFINITY, 0.0, false, "count", ex.what()});
  }
  return results;
}

#endif  // MT_HAVE_CUDA

}  // namespace mt::train
