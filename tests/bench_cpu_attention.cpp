// CPU attention against the CPU GEMM, in one run (issue 32's bar: attention at no less than half the
// GEMM rate for T >= 256). For a GPT-2-shaped batch (B, T, C = 768, 12 heads, fp32, causal) it times
// the materialized and the flash kernels, forward and backward, and the GEMMs of the same step's
// linear layers (M = B T rows) beside the 1024^3 product the calibration uses; attention's rate counts
// the causal half only (the model FLOPs the op profile books), each figure the fastest of `reps`
// runs after one warm-up. Usage: bench_cpu_attention [B] [T] [threads] [reps]   (default 4 256 2 5)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm.h"

namespace {

template <class F>
double fastest(int reps, F&& f) {
  f();  // warm-up: the thread team, first touches
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void row(const char* what, double flops, double seconds, double gemm_rate) {
  const double rate = flops / seconds / 1e9;
  const std::string share = gemm_rate > 0 ? std::to_string(int(100 * rate / gemm_rate + 0.5)) + "%" : "-";
  std::printf("| %-34s | %9.2f | %8.1f | %s |\n", what, seconds * 1e3, rate, share.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const int B = argc > 1 ? std::atoi(argv[1]) : 4, T = argc > 2 ? std::atoi(argv[2]) : 256;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2, reps = argc > 4 ? std::atoi(argv[4]) : 5;
  if (B < 1 || T < 1 || threads < 1 || reps < 1) {
    std::fprintf(stderr, "usage: bench_cpu_attention [B >= 1] [T >= 1] [threads >= 1] [reps >= 1]\n");
    return 2;
  }
  omp_set_num_threads(threads);
  const int C = 768, NH = 12, hs = C / NH, N = B * T;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };

  // The GEMMs of one layer's linear products (forward, input and weight gradients) and the 1024^3
  // calibration product: their summed FLOPs over their summed time is the "GEMM rate".
  struct Product {
    const char* name;
    bool ta, tb;
    int M, N, K;
  };
  const Product products[] = {{"gemm 1024^3 (calibration)", false, false, 1024, 1024, 1024},
                              {"gemm qkv forward", false, true, N, 3 * C, C},
                              {"gemm mlp up forward", false, true, N, 4 * C, C},
                              {"gemm mlp down input grad", false, false, N, 4 * C, C},
                              {"gemm mlp up weight grad", true, false, 4 * C, C, N}};
  std::printf("| %-34s | %9s | %8s | %s |\n", "op", "ms", "GFLOP/s", "of GEMM rate");
  std::printf("|------------------------------------|----------:|---------:|---|\n");
  double gemm_flops = 0, gemm_seconds = 0;
  for (const Product& p : products) {
    const std::vector<float> a = random(size_t(p.M) * p.K), b = random(size_t(p.K) * p.N);
    std::vector<float> c(size_t(p.M) * p.N);
    const double s = fastest(reps, [&] {
      mt::cpu::gemm<float>(p.ta, p.tb, p.M, p.N, p.K, 1.f, a.data(), p.ta ? p.M : p.K, b.data(), p.tb ? p.K : p.N, 0.f,
                           c.data(), p.N);
    });
    const double flops = 2.0 * p.M * p.N * p.K;
    row(p.name, flops, s, 0);
    if (&p != &products[0]) {
      gemm_flops += flops;
      gemm_seconds += s;
    }
  }
  const double gemm_rate = gemm_flops / gemm_seconds / 1e9;
  std::printf("| %-34s | %9s | %8.1f | 100%% |\n", "GEMM rate (the step's shapes)", "", gemm_rate);

  const size_t n3 = size_t(N) * 3 * C, n1 = size_t(N) * C, tt = size_t(B) * NH * T * T;
  const std::vector<float> qkv = random(n3), dout = random(n1);
  std::vector<float> out(n1), att(tt), dqkv(n3), scratch(tt), lse(size_t(B) * NH * T);
  const double fwd_flops = 2.0 * B * NH * (double(T) * (T + 1) / 2) * 2.0 * hs, bwd_flops = 2 * fwd_flops;
  using namespace mt::cpu;
  row("attention materialized forward", fwd_flops,
      fastest(reps, [&] { attention_fwd<float>(out.data(), att.data(), qkv.data(), nullptr, B, T, C, NH); }), gemm_rate);
  row("attention materialized backward", bwd_flops, fastest(reps, [&] {
        attention_bwd<float>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), nullptr, B, T, C, NH);
      }),
      gemm_rate);
  row("attention flash forward", fwd_flops,
      fastest(reps, [&] { flash_attention_fwd<float>(out.data(), lse.data(), qkv.data(), nullptr, B, T, C, NH); }),
      gemm_rate);
  row("attention flash backward", bwd_flops, fastest(reps, [&] {
        flash_attention_bwd<float>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                   nullptr, B, T, C, NH);
      }),
      gemm_rate);
  std::printf("(B=%d T=%d C=%d heads=%d fp32, %d threads, GEMM backend %s; fastest of %d runs)\n", B, T, C, NH,
              threads, gemm_backend(false), reps);
  return 0;
}
