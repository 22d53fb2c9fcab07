#include "train/calibrate.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "checkpoint/fsio.h"
#include "runtime/check.h"
#include "train/hardware.h"
#include "train/metrics.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "train/options.h"

namespace mt::train {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr const char* kGemmLabel = "GEMM: the model's fp32 matmul forward and backward at 1024 x 768 -> 3072";
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Best time of `reps` runs of f.
template <class F>
double best_of(int reps, F f) {
  double best = 1e30;
  for (int rep = 0; rep < reps; rep++) {
    const auto t0 = clock_type::now();
    f();
    best = std::min(best, since(t0));
  }
  return best;
}

// The rate of a training-shaped GEMM pair: a layer's forward (N rows x IC in -> OC out) and its
// backward (input and weight gradients), 6 N IC OC FLOPs, through the model's own matmul ops; best
// of several. Square 1024^3 products run faster than the trainer's, so this is what a plan uses.
double training_gemm_rate() {
  const int N = 1024, IC = 768, OC = 3072;
  std::vector<float> in(size_t(N) * IC, 0.5f), w(size_t(OC) * IC, 0.25f), out(size_t(N) * OC), din(size_t(N) * IC),
      dw(size_t(OC) * IC, 0.f);
  ops::Ctx ctx;
  return 6.0 * N * IC * double(OC) / best_of(4, [&] {
    ops::matmul_fwd<float>(out.data(), in.data(), w.data(), nullptr, N, IC, OC, ctx);
    ops::matmul_bwd<float>(din.data(), dw.data(), nullptr, out.data(), in.data(), w.data(), N, IC, OC, ctx);
  });
}

// Bytes read plus written per second by a parallel copy of 256 MiB, best of several.
double memory_bandwidth() {
  const size_t n = size_t(32) << 20;  // doubles: 256 MiB each way
  std::vector<double> a(n, 1.0), b(n, 0.0);
  int rep = 0;
  const double best = best_of(6, [&] {
    rep++;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < long(n); i++) b[size_t(i)] = a[size_t(i)] + 1e-9 * double(rep);
  });
  if (b[n / 2] < 0) std::puts("");  // keep the copy
  return 2.0 * double(n) * sizeof(double) / best;
}

// The attention kernels' forward and backward (materialized or flash) at B = 4, T = 256, GPT-2's width
// and heads, in FLOPs of the planner's formula (train/metrics.h attention_flops_per_token) per second.
double attention_rate(bool flash) {
  const int B = 4, T = 256, C = 768, NH = 12;
  model::GPTConfig cfg;
  cfg.n_layer = 1;
  cfg.n_embd = C;
  cfg.n_head = NH;
  const model::Attention a = flash ? model::Attention::flash : model::Attention::materialized;
  const double flops = attention_flops_per_token(cfg, T, model::Recompute::none, a, Device::cpu) * B * T;
  const size_t rows = size_t(B) * T, probs = flash ? size_t(B) * NH * T : size_t(B) * NH * T * T;
  std::vector<float> qkv(rows * 3 * C, 0.01f), out(rows * C), dout(rows * C, 0.01f), dqkv(rows * 3 * C), saved(probs),
      scratch(probs);
  for (size_t i = 0; i < qkv.size(); i++) qkv[i] = 0.01f * float(int(i % 97) - 48);
  ops::Ctx ctx;
  return flops / best_of(3, [&] {
    if (flash) {
      ops::flash_attention_fwd<float>(out.data(), saved.data(), qkv.data(), nullptr, B, T, C, NH, ctx);
      ops::flash_attention_bwd<float>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), out.data(), saved.data(),
                                      nullptr, B, T, C, NH, ctx);
    } else {
      ops::attention_fwd<float>(out.data(), saved.data(), qkv.data(), nullptr, B, T, C, NH, ctx);
      ops::attention_bwd<float>(dqkv.data(), scratch.data(), dout.data(), qkv.data(), saved.data(), nullptr, B, T, C,
                                NH, ctx);
    }
  });
}

// AdamW over 4 Mi parameters, in the planner's 32 bytes per element (train/plan_cost.cpp), per second.
double optimizer_rate() {
  const int64_t n = int64_t(4) << 20;
  std::vector<float> p(size_t(n), 0.1f), m(size_t(n), 0.f), v(size_t(n), 0.f), g(size_t(n), 0.01f);
  ops::Ctx ctx;
  int t = 0;
  return 32.0 * double(n) / best_of(4, [&] {
    ops::adamw(p.data(), m.data(), v.data(), g.data(), n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++t, ctx);
  });
}

// A sum of squares over 16 Mi fp32 values (the gradient norms), in bytes read per second.
double reduction_rate() {
  const int64_t n = int64_t(16) << 20;
  std::vector<float> g(size_t(n), 0.01f);
  ops::Ctx ctx;
  double sink = 0;
  const double s = best_of(4, [&] { sink += ops::sum_squares(g.data(), n, ctx); });
  if (sink < 0) std::puts("");  // keep the sum
  return 4.0 * double(n) / s;
}

// Ping-pong between ranks 0 and 1 (messages of 2-byte elements); the others wait at the barrier.
nlohmann::json ping_pong(parallel::Comm& world, LinkSpec& link) {
  nlohmann::json samples = nlohmann::json::array();
  std::vector<char> buf(size_t(16) << 20);
  for (size_t bytes = 8; bytes <= buf.size(); bytes *= 8) {
    const int reps = bytes < (size_t(1) << 20) ? 200 : 10;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
      world.barrier();
      const auto t0 = clock_type::now();
      if (world.rank() == 0) {
        world.send(buf.data(), bytes / 2, DType::u16, 1);
        world.recv(buf.data(), bytes / 2, DType::u16, 1);
      } else if (world.rank() == 1) {
        world.recv(buf.data(), bytes / 2, DType::u16, 0);
        world.send(buf.data(), bytes / 2, DType::u16, 0);
      }
      best = std::min(best, since(t0) / 2);  // one way
    }
    samples.push_back({{"bytes", bytes}, {"one_way_s", best}, {"bytes_per_s", double(bytes) / best}});
    if (bytes == 8) link.latency_s = best;
    link.bytes_per_s = double(bytes) / best;
  }
  return samples;
}

}  // namespace

nlohmann::json calibrate_hardware(parallel::Comm& world, int threads) {
  if (threads > 0) omp_set_num_threads(threads);
  const int t = omp_get_max_threads();
  world.barrier();
  const Peak square = calibrate_cpu_peak(t);  // every rank at once: each rank's share of the cores
  world.barrier();
  const double gemm = training_gemm_rate();
  world.barrier();
  const double bw = memory_bandwidth();
  world.barrier();
  const double attention = attention_rate(false), flash = attention_rate(true);
  world.barrier();
  const double optimizer = optimizer_rate(), reduction = reduction_rate();
  // The slowest rank's figures: a plan must hold on every rank.
  float mins[6] = {float(-gemm), float(-bw), float(-attention), float(-flash), float(-optimizer), float(-reduction)};
  world.all_reduce(mins, 6, DType::f32, parallel::ReduceOp::max);  // the maximum of the negated figures
  Hardware h = resolve_hardware("cpu");
  h.name = "cpu-calibrated";
  h.flops_fp32 = h.flops_bf16 = h.flops_fp16 = -double(mins[0]);
  h.memory_bytes_per_s = -double(mins[1]);
  h.attention_flops_per_s = -double(mins[2]);
  h.flash_attention_flops_per_s = -double(mins[3]);
  h.optimizer_bytes_per_s = -double(mins[4]);
  h.reduction_bytes_per_s = -double(mins[5]);
  const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  h.memory_bytes = phys / world.size();
  h.chips_per_node = world.size();
  nlohmann::json samples = nlohmann::json::object();
  samples["gemm_square"] = {{"label", square.label}, {"flops_per_s", square.flops}};
  samples["gemm_training"] = {{"shape", "1024 x 768 -> 3072, forward and backward"}, {"flops_per_s", gemm}};
  samples["ops"] = {{"attention", "forward and backward, B 4, T 256, C 768, 12 heads, causal"},
                    {"optimizer", "AdamW over 4 Mi fp32 parameters"},
                    {"reduction", "sum of squares over 16 Mi fp32 values"}};
  if (world.size() > 1) {
    samples["mpi_ping_pong"] = ping_pong(world, h.intra);
    h.inter = h.intra;
    h.source = strfmt("measured by minitrain bench --calibrate: %d ranks x %d threads; %s; memory: a parallel copy "
                      "of 256 MiB; links: MPI ping-pong between ranks 0 and 1 (one machine: inter = intra)",
                      world.size(), t, kGemmLabel);
  } else {
    h.source = strfmt("measured by minitrain bench --calibrate: 1 rank x %d threads; %s; memory: a parallel copy "
                      "of 256 MiB; links not measured (one rank): the built-in cpu entry's", t, kGemmLabel);
  }
  nlohmann::json j = h.to_json();
  j["samples"] = samples;
  return j;
}

int calibrate_main(const std::vector<std::string>& args, parallel::Comm& world) {
  std::string out;
  int threads = 0;
  for (const std::string& a : args) {
    if (a == "--calibrate") continue;
    if (a.rfind("out=", 0) == 0) out = a.substr(4);
    else if (a.rfind("threads=", 0) == 0) threads = parse_int("threads", a.substr(8));
    else fail("bench --calibrate: unexpected argument '%s' (expected out=FILE, threads=N)", a.c_str());
  }
  if (threads < 0) fail("threads must not be negative (got %d)", threads);
  const nlohmann::json j = calibrate_hardware(world, threads);
  if (world.rank() != 0) return 0;
  const std::string text = j.dump(2) + "\n";
  if (out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  checkpoint::io::write_file_atomically(out, text);
  hardware_from_json(j, out);  // what plan will read back
  const nlohmann::json& r = j["ops"];
  std::fprintf(stderr,
               "bench --calibrate: wrote %s (per rank: GEMM %.1f GFLOP/s, attention %.1f / flash %.1f GFLOP/s, memory "
               "%.1f GB/s, optimizer %.1f GB/s, norms %.1f GB/s)\n",
               out.c_str(), j["flops"]["fp32"].get<double>() / 1e9, r["attention_flops_per_s"].get<double>() / 1e9,
               r["flash_attention_flops_per_s"].get<double>() / 1e9, j["memory"]["bytes_per_s"].get<double>() / 1e9,
               r["optimizer_bytes_per_s"].get<double>() / 1e9, r["reduction_bytes_per_s"].get<double>() / 1e9);
  return 0;
}

}  // namespace mt::train
