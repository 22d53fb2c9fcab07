// How evenly causal attention's work falls on the cp ranks: zigzag chunks (parallel/ring_attention.h)
// against contiguous ones. For each layout and cp, every rank's queries meet every rank's key/value
// block as the ring would bring them (hidden pairs skipped, as ring attention does), on one thread, one
// rank after the other; the table gives each rank's visible (query, key) pairs (attention FLOPs are
// 4 hs per pair forward, 8 hs backward: proportional) and its measured forward + backward time, and the
// max over min of both. Usage: bench_cp_balance [T] [reps]   (default T = 2048, 3 reps: min time kept)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "parallel/ring_attention.h"

namespace {

using mt::parallel::Zigzag;

std::vector<int32_t> rank_positions(bool zigzag, int T, int cp, int r) {
  if (zigzag) return Zigzag{T, cp, r}.positions();
  std::vector<int32_t> p(size_t(T / cp));
  for (size_t t = 0; t < p.size(); t++) p[t] = int32_t(r * (T / cp) + int(t));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1]) : 2048, reps = argc > 2 ? std::atoi(argv[2]) : 3;
  const int B = 1, NH = 2, C = 128;  // two heads of 64
  omp_set_num_threads(1);
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::printf("| layout | cp | visible pairs per rank (millions) | max/min pairs | fwd+bwd ms per rank |"
              " max/min time |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int cp : {2, 4, 8}) {
    if (T % (2 * cp) != 0) continue;
    const int Tl = T / cp;
    // Per rank: its qkv rows (random), dout.
    std::vector<std::vector<float>> qkv(static_cast<size_t>(cp)), dout(static_cast<size_t>(cp));
    for (int r = 0; r < cp; r++) {
      qkv[size_t(r)].resize(size_t(B) * Tl * 3 * C);
      dout[size_t(r)].resize(size_t(B) * Tl * C);
      for (float& x : qkv[size_t(r)]) x = u(rng);
      for (float& x : dout[size_t(r)]) x = u(rng);
    }
    for (bool zigzag : {false, true}) {
      std::vector<double> pairs(size_t(cp), 0), ms(size_t(cp), std::numeric_limits<double>::infinity());
      for (int r = 0; r < cp; r++) {
        const std::vector<int32_t> qp = rank_positions(zigzag, T, cp, r);
        for (int s = 0; s < cp; s++) {
          const std::vector<int32_t> kp = rank_positions(zigzag, T, cp, s);
          for (int32_t a : qp)
            for (int32_t b : kp) pairs[size_t(r)] += b <= a;
        }
        for (int rep = 0; rep < reps; rep++) {
          std::vector<float> O(size_t(B) * Tl * C, 0.f), L(size_t(B) * NH * Tl, -INFINITY), po(O.size()),
              pl(L.size()), D(L.size()), dq(O.size(), 0.f), dkv(size_t(B) * Tl * 2 * C, 0.f);
          const auto t0 = std::chrono::steady_clock::now();
          for (int s = 0; s < cp; s++) {
            const std::vector<int32_t> kp = rank_positions(zigzag, T, cp, s);
            if (mt::cpu::attention_block_hidden(qp.data(), kp.data(), nullptr, nullptr, B, Tl, Tl)) continue;
            const float* kv = qkv[size_t(s)].data();
            mt::cpu::flash_block_fwd<float>(po.data(), pl.data(), qkv[size_t(r)].data(), 3 * C, kv + C, kv + 2 * C,
                                            3 * C, qp.data(), kp.data(), nullptr, nullptr, B, Tl, Tl, C, NH);
            mt::cpu::attention_merge<float>(O.data(), L.data(), po.data(), pl.data(), B, Tl, C, NH);
          }
          mt::cpu::attention_delta<float>(D.data(), dout[size_t(r)].data(), O.data(), B, Tl, C, NH);
          for (int s = 0; s < cp; s++) {
            const std::vector<int32_t> kp = rank_positions(zigzag, T, cp, s);
            if (mt::cpu::attention_block_hidden(qp.data(), kp.data(), nullptr, nullptr, B, Tl, Tl)) continue;
            const float* kv = qkv[size_t(s)].data();
            mt::cpu::flash_block_bwd<float>(dq.data(), dkv.data(), dkv.data() + C, 2 * C, dout[size_t(r)].data(),
                                            qkv[size_t(r)].data(), 3 * C, kv + C, kv + 2 * C, 3 * C, L.data(),
                                            D.data(), qp.data(), kp.data(), nullptr, nullptr, B, Tl, Tl, C, NH);
          }
          const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          ms[size_t(r)] = std::min(ms[size_t(r)], t);
        }
      }
      std::printf("| %s | %d |", zigzag ? "zigzag" : "contiguous", cp);
      for (int r = 0; r < cp; r++) std::printf(" %.2f", pairs[size_t(r)] / 1e6);
      const auto [pmin, pmax] = std::minmax_element(pairs.begin(), pairs.end());
      std::printf(" | %.2f |", *pmax / *pmin);
      for (int r = 0; r < cp; r++) std::printf(" %.0f", ms[size_t(r)]);
      std::printf(" | %.2f |\n", *std::max_element(ms.begin(), ms.end()) / *std::min_element(ms.begin(), ms.end()));
      std::fflush(stdout);
    }
  }
  return 0;
}
