// Determinism of the CPU reference: every op gives bitwise identical results when repeated, and the
// ops whose reductions use a fixed split (parameter-gradient sums over rows, scatter-adds, softmax,
// per-head attention, the built-in GEMM) give identical results for 1, 2 and 3 OpenMP threads.
// The bf16 instantiations keep the same properties. When matmuls go to OpenBLAS (CPUs without a built-in SIMD kernel), its panels follow the thread
// count, so there only repeatability is promised.
// Sizes are chosen above the kernels' threshold for going parallel.
#include <gtest/gtest.h>
#include <omp.h>

#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"
#include "tests/test_util.h"

namespace mt::cpu {
namespace {

constexpr size_t sz(int64_t n) { return static_cast<size_t>(n); }

using Outputs = std::vector<std::vector<float>>;

// Runs `op` (which fills fresh outputs) with each thread count and expects identical outputs.
void expect_thread_count_independent(const std::function<Outputs()>& op) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Outputs ref = op();
  for (int threads : {2, 3}) {
    omp_set_num_threads(threads);
    const Outputs got = op();
    ASSERT_EQ(got.size(), ref.size());
    for (size_t k = 0; k < ref.size(); k++)
      EXPECT_EQ(got[k], ref[k]) << "output " << k << ", " << threads << " threads";
  }
  omp_set_num_threads(saved);
}

class Determinism : public ::testing::Test {
 protected:
  std::mt19937_64 rng{mt::testing::test_seed()};
  std::vector<float> rand(size_t n) { return mt::testing::random_floats(n, rng); }
};

TEST_F(Determinism, LayerNormIsIndependentOfThreadCount) {
  const int N = 301, C = 203;
  auto x = rand(sz(N) * C), w = rand(sz(C)), b = rand(sz(C)), dy = rand(sz(N) * C);
  expect_thread_count_independent([&] {
    std::vector<float> y(x.size()), mean(sz(N)), rstd(sz(N)), dx(x.size()), dw(sz(C), 0.5f), db(sz(C), 0.25f);
    layernorm_fwd<float>(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    layernorm_bwd<float>(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                         C);
    return Outputs{y, mean, rstd, dx, dw, db};
  });
}

TEST_F(Determinism, EncoderBackwardIsIndependentOfThreadCount) {
  const int B = 3, T = 101, C = 130, V = 17;  // many repeated tokens collide in dwte
  std::vector<int32_t> tokens(sz(B) * T);
  for (auto& t : tokens) t = int32_t(rng() % V);
  auto dout = rand(sz(B) * T * C);
  expect_thread_count_independent([&] {
    std::vector<float> dwte(sz(V) * C, 0.f), dwpe(sz(T) * C, 0.f);
    encoder_bwd<float>(dwte.data(), dwpe.data(), dout.data(), tokens.data(), nullptr, B, T, C);
    return Outputs{dwte, dwpe};
  });
}

TEST_F(Determinism, AttentionIsIndependentOfThreadCount) {
  const int B = 2, T = 100, C = 32, NH = 4;
  auto qkv = rand(sz(B) * T * 3 * C), dout = rand(sz(B) * T * C);
  std::vector<int32_t> doc(sz(B) * T);
  for (size_t i = 0; i < doc.size(); i++) doc[i] = int32_t(i / 37);
  for (const int32_t* d : {static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(doc.data())}) {
    expect_thread_count_independent([&] {
      std::vector<float> out(dout.size()), att(sz(B) * NH * T * T), dqkv(qkv.size()), scratch(att.size());
      attention_fwd<float>(out.data(), att.data(), qkv.data(), d, B, T, C, NH);
      attention_bwd<float>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), d, B, T, C, NH);
      return Outputs{out, att, dqkv};
    });
  }
}

TEST_F(Determinism, SoftmaxXentAndElementwiseOpsAreIndependentOfThreadCount) {
  const int N = 67, V = 1001, Vp = 1024;
  auto logits = rand(sz(N) * Vp);
  std::vector<int32_t> targets(sz(N));
  for (auto& t : targets) t = int32_t(rng() % V);
  targets[3] = -1;
  auto x = rand(50000), y = rand(50000);
  expect_thread_count_independent([&] {
    std::vector<float> losses(sz(N)), dlogits(logits.size()), g(x.size()), dg(x.size()), s(x.size());
    softmax_xent<float>(losses.data(), dlogits.data(), logits.data(), targets.data(), 1.f / N, N, V, Vp);
    gelu_fwd<float>(g.data(), x.data(), int64_t(x.size()));
    gelu_bwd<float>(dg.data(), y.data(), x.data(), int64_t(x.size()));
    add<float>(s.data(), x.data(), y.data(), int64_t(x.size()));
    return Outputs{losses, dlogits, g, dg, s};
  });
}

TEST_F(Determinism, MatmulIsRepeatableAndIndependentOfThreadCountWithTheBuiltinGemm) {
  const int N = 257, IC = 129, OC = 191;
  auto inp = rand(sz(N) * IC), w = rand(sz(OC) * IC), b = rand(sz(OC)), dout = rand(sz(N) * OC);
  auto run = [&] {
    std::vector<float> out(sz(N) * OC), dinp(inp.size()), dw(w.size(), 0.f), db(b.size(), 0.f);
    matmul_fwd<float>(out.data(), inp.data(), w.data(), b.data(), N, IC, OC);
    matmul_bwd<float>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC, OC);
    return Outputs{out, dinp, dw, db};
  };
  const Outputs first = run(), second = run();
  EXPECT_EQ(first, second);
  if (std::string(gemm_backend()) == "OpenBLAS") {
    expect_thread_count_independent([&] { return Outputs{run()[3]}; });
  } else {
    expect_thread_count_independent(run);
  }
}

// The 16-bit paths load into per-thread fp32 scratch and run the same fixed-order code, so they keep
// the float path's thread-count independence (matmul: where the built-in GEMM runs).
TEST_F(Determinism, Bf16PathsAreIndependentOfThreadCount) {
  const int N = 257, IC = 129, OC = 191, B = 2, T = 100, C = 32, NH = 4;
  auto to_bf16 = [](const std::vector<float>& v) {
    std::vector<bf16> s(v.size());
    for (size_t i = 0; i < v.size(); i++) s[i] = store_as<bf16>(v[i]);
    return s;
  };
  auto widen = [](const std::vector<bf16>& s) {
    std::vector<float> v(s.size());
    for (size_t i = 0; i < s.size(); i++) v[i] = load(s[i]);
    return v;
  };
  const auto inp = to_bf16(rand(sz(N) * IC)), w = to_bf16(rand(sz(OC) * IC)), b = to_bf16(rand(sz(OC))),
             dout = to_bf16(rand(sz(N) * OC)), lnw = to_bf16(rand(sz(IC)));
  const auto qkv = to_bf16(rand(sz(B) * T * 3 * C)), adout = to_bf16(rand(sz(B) * T * C));
  std::vector<int32_t> doc(sz(B) * T);
  for (size_t i = 0; i < doc.size(); i++) doc[i] = int32_t(i / 37);
  auto run = [&] {
    std::vector<bf16> out(sz(N) * OC), pre(out.size()), dinp(inp.size()), ln(inp.size()), dln(inp.size());
    std::vector<float> dw(w.size(), 0.f), db(b.size(), 0.f), mean(sz(N)), rstd(sz(N)), dlnw(sz(IC), 0.f);
    matmul_fwd<bf16>(out.data(), inp.data(), w.data(), b.data(), N, IC, OC, pre.data());
    matmul_bwd<bf16>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, IC, OC);
    layernorm_fwd<bf16>(ln.data(), mean.data(), rstd.data(), inp.data(), lnw.data(), nullptr, N, IC);
    layernorm_bwd<bf16>(dln.data(), dlnw.data(), nullptr, dinp.data(), inp.data(), lnw.data(), mean.data(),
                        rstd.data(), N, IC, true);
    std::vector<bf16> aout(adout.size()), att(sz(B) * NH * T * T), dqkv(qkv.size()), fout(adout.size()),
        fdqkv(qkv.size());
    std::vector<float> scratch(att.size()), lse(sz(B) * NH * T), fscratch(lse.size());
    attention_fwd<bf16>(aout.data(), att.data(), qkv.data(), doc.data(), B, T, C, NH);
    attention_bwd<bf16>(dqkv.data(), scratch.data(), adout.data(), qkv.data(), att.data(), doc.data(), B, T, C, NH);
    flash_attention_fwd<bf16>(fout.data(), lse.data(), qkv.data(), doc.data(), B, T, C, NH);
    flash_attention_bwd<bf16>(fdqkv.data(), fscratch.data(), adout.data(), qkv.data(), fout.data(), lse.data(),
                              doc.data(), B, T, C, NH);
    return Outputs{widen(out), widen(pre), widen(dinp), dw, db, widen(ln), widen(dln), dlnw, widen(aout),
                   widen(att), widen(dqkv), widen(fout), lse, widen(fdqkv)};
  };
  const Outputs first = run(), second = run();
  EXPECT_EQ(first, second);
  if (std::string(gemm_backend()) == "OpenBLAS") GTEST_SKIP() << "matmuls run on OpenBLAS: repeatability only";
  expect_thread_count_independent(run);
}

}  // namespace
}  // namespace mt::cpu
