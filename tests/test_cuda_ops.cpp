// Every CUDA op against the CPU reference (kernels/cpu) on fresh random inputs, at shapes that include
// 1, odd and prime sizes, sizes just past a warp or block, and unaligned device pointers. Each test
// skips when there is no CUDA device.
//
// Outputs that an op assigns are pre-filled with garbage on the device, so a kernel that skips an
// element fails; outputs it accumulates into start from the same random values on both backends, so
// `=` in place of `+=` fails too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/tolerances.h"
#include "kernels/ops.h"
#include "runtime/check.h"
#include "runtime/dtype.h"
#include "tests/test_util.h"

namespace {

using mt::testing::max_rel_error;
using mt::testing::random_floats;
using mt::testing::test_seed;

namespace tol = ::mt::cuda::tol;  // kernels/cuda/tolerances.h

// A device copy of a host vector, freed on scope exit.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    p_ = static_cast<T*>(mt::cuda::device_alloc(bytes()));
    mt::cuda::copy_to_device(p_, host.data(), bytes());
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    try {
      mt::cuda::device_free(p_);
    } catch (const mt::Error&) {  // a failed free must not terminate the test binary
    }
  }
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> v(n_);
    mt::cuda::synchronize();
    mt::cuda::copy_to_host(v.data(), p_, bytes());
    return v;
  }

 private:
  size_t bytes() const { return n_ * sizeof(T); }
  size_t n_;
  T* p_ = nullptr;
};

std::vector<int32_t> random_ints(size_t n, int lo, int hi, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Packed documents: per batch row, ids 0, 1, 2, ... in runs of random length (possibly 1 token).
std::vector<int32_t> random_docs(int B, int T, std::mt19937_64& rng) {
  std::vector<int32_t> doc(size_t(B) * T);
  std::uniform_int_distribution<int> run(1, std::max(1, T / 3));
  for (int b = 0; b < B; b++) {
    int id = 0, left = run(rng);
    for (int t = 0; t < T; t++) {
      if (left-- == 0) id++, left = run(rng) - 1;
      doc[size_t(b) * T + t] = id;
    }
  }
  return doc;
}

::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want, double tolerance) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  const double err = max_rel_error(got.data(), want.data(), got.size());
  if (err <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max rel error " << err << " > tolerance " << tolerance;
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (mt::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
  std::mt19937_64 rng{test_seed()};
  const mt::ops::Ctx gpu{mt::Device::cuda, nullptr};
};

TEST_F(CudaOps, EncoderForwardIsExactlyTheCpuGather) {
  struct Shape { int B, T, C, V; };
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 7, 13, 11}, Shape{3, 33, 64, 50}, Shape{4, 64, 97, 257}}) {
    for (bool explicit_pos : {false, true}) {
      SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " pos=" << explicit_pos);
      const int maxT = s.T + 3;
      auto tokens = random_ints(size_t(s.B) * s.T, 0, s.V - 1, rng);
      auto pos = random_ints(size_t(s.B) * s.T, 0, maxT - 1, rng);
      auto wte = random_floats(size_t(s.V) * s.C, rng);
      auto wpe = random_floats(size_t(maxT) * s.C, rng);
      std::vector<float> want(size_t(s.B) * s.T * s.C);
      mt::cpu::encoder_fwd<float>(want.data(), tokens.data(), explicit_pos ? pos.data() : nullptr, wte.data(),
                                  wpe.data(), s.B, s.T, s.C);
      DeviceArray<int32_t> d_tok(tokens), d_pos(pos);
      DeviceArray<float> d_wte(wte), d_wpe(wpe), d_out(random_floats(want.size(), rng));
      mt::cuda::encoder_fwd(d_out.get(), d_tok.get(), explicit_pos ? d_pos.get() : nullptr, d_wte.get(),
                            d_wpe.get(), s.B, s.T, s.C, gpu);
      EXPECT_TRUE(close(d_out.host(), want, tol::kExact));
    }
  }
}

TEST_F(CudaOps, EncoderBackwardAccumulatesLikeCpuAndIsDeterministic) {
  struct Shape { int B, T, C, V; };
  // Small vocabularies force many repeated tokens; C = 300 spans two column tiles.
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 7, 13, 3}, Shape{3, 37, 300, 17}, Shape{4, 257, 64, 1000}}) {
    for (bool explicit_pos : {false, true}) {
      SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " pos=" << explicit_pos);
      const int maxT = s.T + 2;
      auto tokens = random_ints(size_t(s.B) * s.T, 0, s.V - 1, rng);
      auto pos = random_ints(size_t(s.B) * s.T, 0, maxT - 1, rng);
      const int32_t* cpu_pos = explicit_pos ? pos.data() : nullptr;
      auto dout = random_floats(size_t(s.B) * s.T * s.C, rng);
      auto dwte0 = random_floats(size_t(s.V) * s.C, rng);
      auto dwpe0 = random_floats(size_t(maxT) * s.C, rng);
      auto dwte = dwte0, dwpe = dwpe0;
      mt::cpu::encoder_bwd<float>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), cpu_pos, s.B, s.T, s.C);

      DeviceArray<int32_t> d_tok(tokens), d_pos(pos);
      DeviceArray<float> d_dout(dout), d_dwte(dwte0), d_dwpe(dwpe0), d_dwte2(dwte0), d_dwpe2(dwpe0);
      const int32_t* gpu_pos = explicit_pos ? d_pos.get() : nullptr;
      mt::cuda::encoder_bwd(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tok.get(), gpu_pos, s.B, s.T, s.C, gpu);
      mt::cuda::encoder_bwd(d_dwte2.get(), d_dwpe2.get(), d_dout.get(), d_tok.get(), gpu_pos, s.B, s.T, s.C, gpu);
      auto got_wte = d_dwte.host(), got_wpe = d_dwpe.host();
      EXPECT_TRUE(close(got_wte, dwte, tol::kEncoderBwd));
      EXPECT_TRUE(close(got_wpe, dwpe, tol::kEncoderBwd));
      EXPECT_EQ(got_wte, d_dwte2.host()) << "two identical backward calls gave different bits";
      EXPECT_EQ(got_wpe, d_dwpe2.host()) << "two identical backward calls gave different bits";
    }
  }
}

TEST_F(CudaOps, LayerNormForwardMatchesCpu) {
  struct Shape { int N, C; };
  for (Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{17, 31}, Shape{33, 768}, Shape{5, 1031}}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C << " bias=" << with_bias);
      auto inp = random_floats(size_t(s.N) * s.C, rng, 2.f, 5.f);  // a large mean tests the two-pass variance
      auto w = random_floats(size_t(s.C), rng);
      auto b = random_floats(size_t(s.C), rng);
      std::vector<float> out(inp.size()), mean(size_t(s.N)), rstd(size_t(s.N));
      mt::cpu::layernorm_fwd<float>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                    with_bias ? b.data() : nullptr, s.N, s.C);
      DeviceArray<float> d_inp(inp), d_w(w), d_b(b), d_out(random_floats(out.size(), rng)),
          d_mean(random_floats(mean.size(), rng)), d_rstd(random_floats(rstd.size(), rng));
      mt::cuda::layernorm_fwd(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(),
                              with_bias ? d_b.get() : nullptr, s.N, s.C, gpu);
      EXPECT_TRUE(close(d_out.host(), out, tol::kLayerNorm)) << "out";
      EXPECT_TRUE(close(d_mean.host(), mean, tol::kLayerNorm)) << "mean";
      EXPECT_TRUE(close(d_rstd.host(), rstd, tol::kLayerNorm)) << "rstd";
    }
  }
}

TEST_F(CudaOps, LayerNormBackwardAssignsDinpAndAccumulatesParameterGrads) {
  struct Shape { int N, C; };
  for (Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{37, 31}, Shape{130, 768}, Shape{5, 1031}}) {
    SCOPED_TRACE(testing::Message() << "N=" << s.N << " C=" << s.C);
    auto inp = random_floats(size_t(s.N) * s.C, rng, -2.f, 3.f);
    auto w = random_floats(size_t(s.C), rng);
    auto b = random_floats(size_t(s.C), rng);
    auto dout = random_floats(inp.size(), rng);
    std::vector<float> out(inp.size()), mean(size_t(s.N)), rstd(size_t(s.N));
    mt::cpu::layernorm_fwd<float>(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), s.N, s.C);
    auto dw0 = random_floats(size_t(s.C), rng), db0 = random_floats(size_t(s.C), rng);
    std::vector<float> dinp(inp.size());
    auto dw = dw0, db = db0;
    mt::cpu::layernorm_bwd<float>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                                  rstd.data(), s.N, s.C);
    DeviceArray<float> d_inp(inp), d_w(w), d_dout(dout), d_mean(mean), d_rstd(rstd), d_dw(dw0), d_db(db0),
        d_dinp(random_floats(dinp.size(), rng));
    mt::cuda::layernorm_bwd(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(),
                            d_mean.get(), d_rstd.get(), s.N, s.C, gpu);
    EXPECT_TRUE(close(d_dinp.host(), dinp, tol::kLayerNorm)) << "dinp";
    EXPECT_TRUE(close(d_dw.host(), dw, tol::kLayerNorm)) << "dweight";
    EXPECT_TRUE(close(d_db.host(), db, tol::kLayerNorm)) << "dbias";
  }
}

TEST_F(CudaOps, MatmulForwardMatchesCpuWithAndWithoutBias) {
  struct Shape { int N, IC, OC; };
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{37, 101, 53}, Shape{64, 768, 96}, Shape{128, 257, 384}}) {
    // offset 1 makes every device pointer only 4-byte aligned: the GEMM must pick an algorithm that
    // accepts it, and the bias falls back to its own kernel if the fused epilogue cannot take it.
    for (int offset : {0, 1}) {
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(testing::Message() << "N=" << s.N << " IC=" << s.IC << " OC=" << s.OC << " offset=" << offset
                                        << " bias=" << with_bias);
        auto inp = random_floats(size_t(s.N) * s.IC + 1, rng);
        auto w = random_floats(size_t(s.OC) * s.IC + 1, rng);
        auto bias = random_floats(size_t(s.OC) + 1, rng);
        std::vector<float> want(size_t(s.N) * s.OC);
        mt::cpu::matmul_fwd<float>(want.data(), inp.data() + offset, w.data() + offset,
                                   with_bias ? bias.data() + offset : nullptr, s.N, s.IC, s.OC);
        DeviceArray<float> d_inp(inp), d_w(w), d_bias(bias), d_out(random_floats(want.size() + 1, rng));
        mt::cuda::matmul_fwd(d_out.get() + offset, d_inp.get() + offset, d_w.get() + offset,
                             with_bias ? d_bias.get() + offset : nullptr, s.N, s.IC, s.OC, gpu);
        auto got = d_out.host();
        got.erase(got.begin(), got.begin() + offset);
        got.resize(want.size());
        EXPECT_TRUE(close(got, want, tol::kMatmul));
      }
    }
  }
}

TEST_F(CudaOps, MatmulBackwardAssignsDinpAndAccumulatesDweightDbias) {
  struct Shape { int N, IC, OC; };
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 13, 5}, Shape{37, 101, 53}, Shape{130, 64, 96}, Shape{64, 257, 383}}) {
    for (bool full : {true, false}) {  // full: all three gradients; else dinp and dbias are skipped (nullptr)
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " IC=" << s.IC << " OC=" << s.OC << " full=" << full);
      auto inp = random_floats(size_t(s.N) * s.IC, rng);
      auto w = random_floats(size_t(s.OC) * s.IC, rng);
      auto dout = random_floats(size_t(s.N) * s.OC, rng);
      auto dw0 = random_floats(w.size(), rng), db0 = random_floats(size_t(s.OC), rng);
      std::vector<float> dinp(inp.size());
      auto dw = dw0, db = db0;
      mt::cpu::matmul_bwd<float>(full ? dinp.data() : nullptr, dw.data(), full ? db.data() : nullptr, dout.data(),
                                 inp.data(), w.data(), s.N, s.IC, s.OC);
      DeviceArray<float> d_inp(inp), d_w(w), d_dout(dout), d_dw(dw0), d_db(db0),
          d_dinp(random_floats(dinp.size(), rng));
      mt::cuda::matmul_bwd(full ? d_dinp.get() : nullptr, d_dw.get(), full ? d_db.get() : nullptr, d_dout.get(),
                           d_inp.get(), d_w.get(), s.N, s.IC, s.OC, gpu);
      EXPECT_TRUE(close(d_dw.host(), dw, tol::kMatmul)) << "dweight";
      EXPECT_TRUE(close(d_db.host(), db, tol::kMatmul)) << "dbias";  // unchanged when skipped
      if (full) {
        EXPECT_TRUE(close(d_dinp.host(), dinp, tol::kMatmul)) << "dinp";
      }
    }
  }
}

TEST_F(CudaOps, GeluForwardAndBackwardMatchCpu) {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099), int64_t(100003)}) {
    SCOPED_TRACE(testing::Message() << "N=" << n);
    auto inp = random_floats(size_t(n), rng, -6.f, 6.f);
    auto dout = random_floats(size_t(n), rng);
    std::vector<float> out(static_cast<size_t>(n)), dinp(static_cast<size_t>(n));
    mt::cpu::gelu_fwd<float>(out.data(), inp.data(), n);
    mt::cpu::gelu_bwd<float>(dinp.data(), dout.data(), inp.data(), n);
    DeviceArray<float> d_inp(inp), d_dout(dout), d_out(random_floats(out.size(), rng)),
        d_dinp(random_floats(dinp.size(), rng));
    mt::cuda::gelu_fwd(d_out.get(), d_inp.get(), n, gpu);
    mt::cuda::gelu_bwd(d_dinp.get(), d_dout.get(), d_inp.get(), n, gpu);
    EXPECT_TRUE(close(d_out.host(), out, tol::kGelu)) << "out";
    EXPECT_TRUE(close(d_dinp.host(), dinp, tol::kGelu)) << "dinp";
  }
}

struct AttnShape { int B, T, C, NH; };
// T = 1, odd T, T just past a warp (33) and past the CPU's 64-row blocks (130); hs from 1 to 48.
const AttnShape kAttnShapes[] = {{1, 1, 4, 1}, {2, 7, 12, 3}, {3, 33, 40, 5}, {2, 64, 64, 4}, {1, 130, 96, 2},
                                 {2, 19, 5, 5}};

TEST_F(CudaOps, AttentionForwardMatchesCpuCausalAndDocumentMasked) {
  for (const AttnShape& s : kAttnShapes) {
    for (bool docs : {false, true}) {
      SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH
                                      << " docs=" << docs);
      auto qkv = random_floats(size_t(s.B) * s.T * 3 * s.C, rng, -2.f, 2.f);
      auto doc = random_docs(s.B, s.T, rng);
      const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
      std::vector<float> out(size_t(s.B) * s.T * s.C), att(natt);
      mt::cpu::attention_fwd<float>(out.data(), att.data(), qkv.data(), docs ? doc.data() : nullptr, s.B, s.T, s.C,
                                    s.NH);
      DeviceArray<float> d_qkv(qkv), d_out(random_floats(out.size(), rng)), d_att(random_floats(natt, rng));
      DeviceArray<int32_t> d_doc(doc);
      mt::cuda::attention_fwd(d_out.get(), d_att.get(), d_qkv.get(), docs ? d_doc.get() : nullptr, s.B, s.T, s.C,
                              s.NH, gpu);
      EXPECT_TRUE(close(d_out.host(), out, tol::kAttentionFwd)) << "out";
      auto got_att = d_att.host();
      EXPECT_TRUE(close(got_att, att, tol::kAttentionFwd)) << "att";
      size_t masked_nonzero = 0;
      for (size_t i = 0; i < natt; i++) masked_nonzero += att[i] == 0.f && got_att[i] != 0.f;
      EXPECT_EQ(masked_nonzero, 0u) << "entries a token may not attend to must be exactly 0";
    }
  }
}

TEST_F(CudaOps, AttentionBackwardMatchesCpu) {
  for (const AttnShape& s : kAttnShapes) {
    for (bool docs : {false, true}) {
      SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH
                                      << " docs=" << docs);
      auto qkv = random_floats(size_t(s.B) * s.T * 3 * s.C, rng, -2.f, 2.f);
      auto doc = random_docs(s.B, s.T, rng);
      const int32_t* cpu_doc = docs ? doc.data() : nullptr;
      const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
      std::vector<float> out(size_t(s.B) * s.T * s.C), att(natt), scratch(natt), dqkv(qkv.size());
      mt::cpu::attention_fwd<float>(out.data(), att.data(), qkv.data(), cpu_doc, s.B, s.T, s.C, s.NH);
      auto dout = random_floats(out.size(), rng);
      mt::cpu::attention_bwd<float>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), cpu_doc, s.B,
                                    s.T, s.C, s.NH);
      // Both backends start from the same probabilities, so the backward is compared on its own.
      DeviceArray<float> d_qkv(qkv), d_att(att), d_dout(dout), d_scratch(random_floats(natt, rng)),
          d_dqkv(random_floats(qkv.size(), rng));
      DeviceArray<int32_t> d_doc(doc);
      mt::cuda::attention_bwd(d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(), d_att.get(),
                              docs ? d_doc.get() : nullptr, s.B, s.T, s.C, s.NH, gpu);
      EXPECT_TRUE(close(d_dqkv.host(), dqkv, tol::kAttentionBwd)) << "dqkv";
    }
  }
}

TEST_F(CudaOps, SoftmaxCrossEntropyMatchesCpuWithIgnoredRowsAndPadding) {
  struct Shape { int N, V, Vp; };
  for (Shape s : {Shape{1, 1, 1}, Shape{5, 7, 8}, Shape{13, 101, 128}, Shape{9, 1009, 1024}, Shape{3, 50257, 50304}}) {
    for (int mode = 0; mode < 3; mode++) {  // 0: separate dlogits, 1: in place (dlogits == logits), 2: loss only
      SCOPED_TRACE(testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp << " mode=" << mode);
      auto logits = random_floats(size_t(s.N) * s.Vp, rng, -8.f, 8.f);
      auto targets = random_ints(size_t(s.N), 0, s.V - 1, rng);
      for (size_t i = 1; i < targets.size(); i += 3) targets[i] = -1;  // ignored rows
      const float dloss = 1.f / float(s.N);
      std::vector<float> losses(size_t(s.N)), dlogits(logits.size());
      mt::cpu::softmax_xent<float>(losses.data(), mode == 2 ? nullptr : dlogits.data(), logits.data(), targets.data(),
                                   dloss, s.N, s.V, s.Vp);
      DeviceArray<float> d_logits(logits), d_losses(random_floats(losses.size(), rng)),
          d_dlogits(random_floats(dlogits.size(), rng));
      DeviceArray<int32_t> d_targets(targets);
      float* d_grad = mode == 0 ? d_dlogits.get() : mode == 1 ? d_logits.get() : nullptr;
      mt::cuda::softmax_xent(d_losses.get(), d_grad, d_logits.get(), d_targets.get(), dloss, s.N, s.V, s.Vp, gpu);
      EXPECT_TRUE(close(d_losses.host(), losses, tol::kSoftmaxXent)) << "losses";
      if (mode == 0) {
        EXPECT_TRUE(close(d_dlogits.host(), dlogits, tol::kSoftmaxXent)) << "dlogits";
      } else if (mode == 1) {
        EXPECT_TRUE(close(d_logits.host(), dlogits, tol::kSoftmaxXent)) << "dlogits in place";
      }
    }
  }
}

TEST_F(CudaOps, AdamWMatchesCpu) {
  std::uniform_int_distribution<int> step(1, 1000);
  for (int64_t n : {int64_t(1), int64_t(1001), int64_t(65537)}) {
    const int t = step(rng);
    SCOPED_TRACE(testing::Message() << "N=" << n << " t=" << t);
    auto p = random_floats(size_t(n), rng), g = random_floats(size_t(n), rng);
    auto m = random_floats(size_t(n), rng, -0.1f, 0.1f), v = random_floats(size_t(n), rng, 0.f, 0.01f);
    DeviceArray<float> d_p(p), d_m(m), d_v(v), d_g(g);
    mt::cpu::adamw<float>(p.data(), m.data(), v.data(), g.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    mt::cuda::adamw(d_p.get(), d_m.get(), d_v.get(), d_g.get(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t, gpu);
    EXPECT_TRUE(close(d_p.host(), p, tol::kAdamW)) << "params";
    EXPECT_TRUE(close(d_m.host(), m, tol::kAdamW)) << "m";
    EXPECT_TRUE(close(d_v.host(), v, tol::kAdamW)) << "v";
  }
}

TEST_F(CudaOps, SumSquaresMatchesCpuAndIsBitwiseReproducible) {
  for (int64_t n : {int64_t(1), int64_t(4095), int64_t(4097), int64_t(1000003)}) {
    SCOPED_TRACE(testing::Message() << "N=" << n);
    auto x = random_floats(size_t(n), rng, -3.f, 3.f);
    const double want = mt::cpu::sum_squares<float>(x.data(), n);
    DeviceArray<float> d_x(x);
    const double got = mt::cuda::sum_squares(d_x.get(), n, gpu);
    EXPECT_LE(std::fabs(got - want), tol::kSumSquares * want) << got << " vs " << want;
    const double again = mt::cuda::sum_squares(d_x.get(), n, gpu);
    EXPECT_EQ(std::memcmp(&got, &again, sizeof got), 0) << "two calls on the same data gave different bits";
  }
}

TEST_F(CudaOps, AddAndScaleAreExactIncludingInPlace) {
  for (int64_t n : {int64_t(1), int64_t(31), int64_t(100003)}) {
    SCOPED_TRACE(testing::Message() << "N=" << n);
    auto a = random_floats(size_t(n), rng), b = random_floats(size_t(n), rng);
    std::vector<float> sum(static_cast<size_t>(n));
    mt::cpu::add<float>(sum.data(), a.data(), b.data(), n);
    DeviceArray<float> d_a(a), d_b(b), d_out(random_floats(size_t(n), rng));
    mt::cuda::add(d_out.get(), d_a.get(), d_b.get(), n, gpu);
    EXPECT_TRUE(close(d_out.host(), sum, tol::kExact)) << "add";
    mt::cuda::add(d_a.get(), d_a.get(), d_b.get(), n, gpu);  // out aliases a
    EXPECT_TRUE(close(d_a.host(), sum, tol::kExact)) << "add in place";

    const float s = std::uniform_real_distribution<float>(-4.f, 4.f)(rng);
    mt::cpu::scale<float>(b.data(), s, n);
    mt::cuda::scale(d_b.get(), s, n, gpu);
    EXPECT_TRUE(close(d_b.host(), b, tol::kExact)) << "scale";
  }
}

TEST_F(CudaOps, RoundToIsBitIdenticalToCpuForEveryKindOfValue) {
  // Uniform random bit patterns cover every exponent: NaNs, infinities, fp32 subnormals, values that
  // round into fp16 subnormals or overflow to inf. The fixed list adds exact ties and boundaries.
  std::vector<float> x;
  for (float f : {0.f, -0.f, 1.f, -1.f, INFINITY, -INFINITY, NAN, 65504.f, 65519.f, 65520.f, -65520.f, 6.1035156e-05f,
                  5.9604645e-08f, 2.9802322e-08f, 8.940697e-08f, 1.00390625f, 1.01171875f, 1.0009765625f, 3.4e38f})
    x.push_back(f);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; i++) x.push_back(mt::f32_from_bits(bits(rng)));
  for (mt::DType t : {mt::DType::f32, mt::DType::bf16, mt::DType::f16}) {
    SCOPED_TRACE(mt::dtype_name(t));
    auto want = x;
    mt::cpu::round_to(want.data(), int64_t(want.size()), int(t));
    DeviceArray<float> d_x(x);
    mt::cuda::round_to(d_x.get(), int64_t(x.size()), t, gpu);
    auto got = d_x.host();
    size_t mismatches = 0, first = 0;
    for (size_t i = 0; i < x.size(); i++)
      if (mt::f32_bits(got[i]) != mt::f32_bits(want[i]) && mismatches++ == 0) first = i;
    EXPECT_EQ(mismatches, 0u) << "first at input bits 0x" << std::hex << mt::f32_bits(x[first]) << ": cuda 0x"
                              << mt::f32_bits(got[first]) << ", cpu 0x" << mt::f32_bits(want[first]);
  }
  DeviceArray<float> d_x(x);
  EXPECT_THROW(mt::cuda::round_to(d_x.get(), 1, mt::DType::i32, gpu), mt::Error);
}

TEST_F(CudaOps, AllFiniteFindsASingleInfOrNaNAnywhere) {
  for (int64_t n : {int64_t(1), int64_t(257), int64_t(1000003)}) {
    SCOPED_TRACE(testing::Message() << "N=" << n);
    auto x = random_floats(size_t(n), rng, -1e30f, 1e30f);
    {
      DeviceArray<float> d_x(x);
      EXPECT_TRUE(mt::cuda::all_finite(d_x.get(), n, gpu));
    }
    for (float bad : {INFINITY, -INFINITY, NAN}) {
      auto y = x;
      y[std::uniform_int_distribution<size_t>(0, y.size() - 1)(rng)] = bad;
      DeviceArray<float> d_y(y);
      EXPECT_FALSE(mt::cuda::all_finite(d_y.get(), n, gpu)) << "missed " << bad;
    }
  }
}

TEST_F(CudaOps, OpsDispatchRoutesACudaContextToTheGpu) {
  auto a = random_floats(1000, rng), b = random_floats(1000, rng);
  std::vector<float> want(a.size());
  mt::ops::add(want.data(), a.data(), b.data(), int64_t(a.size()), mt::ops::Ctx{});
  DeviceArray<float> d_a(a), d_b(b), d_out(random_floats(a.size(), rng));
  mt::ops::add(d_out.get(), d_a.get(), d_b.get(), int64_t(a.size()), gpu);
  EXPECT_TRUE(close(d_out.host(), want, tol::kExact));
}

}  // namespace
