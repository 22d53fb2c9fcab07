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
#include "train/options.h"

namespace mt::train {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr const char* kGemmLabel = "GEMM: the model's fp32 matmul forward and backward at 1024 x 768 -> 3072";
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// The rate of a training-shaped GEMM pair: a layer's forward (N rows x IC in -> OC out) and its
// backward (input and weight gradients), 6 N IC OC FLOPs, through the model's own matmul ops; best
// of several. Square 1024^3 products run faster than the trainer's, so this is what a plan uses.
double training_gemm_rate() {
  const int N = 1024, IC = 768, OC = 3072;
  std::vector<float> in(size_t(N) * IC, 0.5f), w(size_t(OC) * IC, 0.25f), out(size_t(N) * OC), din(size_t(N) * IC),
      dw(size_t(OC) * IC, 0.f);
  ops::Ctx ctx;
  double best = 1e30;
  for (int rep = 0; rep < 4; rep++) {
    const auto t0 = clock_type::now();
    ops::matmul_fwd<float>(out.data(), in.data(), w.data(), nullptr, N, IC, OC, ctx);
    ops::matmul_bwd<float>(din.data(), dw.data(), nullptr, out.data(), in.data(), w.data(), N, IC, OC, ctx);
    best = std::min(best, since(t0));
  }
  return 6.0 * N * IC * double(OC) / best;
}

// Bytes read plus written per second by a parallel copy of 256 MiB, best of several.
double memory_bandwidth() {
  const size_t n = size_t(32) << 20;  // doubles: 256 MiB each way
  std::vector<double> a(n, 1.0), b(n, 0.0);
  double best = 1e30;
  for (int rep = 0; rep < 6; rep++) {
    const auto t0 = clock_type::now();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < long(n); i++) b[size_t(i)] = a[size_t(i)] + 1e-9 * double(rep);
    best = std::min(best, since(t0));
  }
  if (b[n / 2] < 0) std::puts("");  // keep the copy
  return 2.0 * double(n) * sizeof(double) / best;
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
  // The slowest rank's figures: a plan must hold on every rank.
  float mins[2] = {float(-gemm), float(-bw)};  // the maximum of the negated figures
  world.all_reduce(mins, 2, DType::f32, parallel::ReduceOp::max);
  Hardware h = resolve_hardware("cpu");
  h.name = "cpu-calibrated";
  h.flops_fp32 = h.flops_bf16 = h.flops_fp16 = -double(mins[0]);
  h.memory_bytes_per_s = -double(mins[1]);
  const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  h.memory_bytes = phys / world.size();
  h.chips_per_node = world.size();
  nlohmann::json samples = nlohmann::json::object();
  samples["gemm_square"] = {{"label", square.label}, {"flops_per_s", square.flops}};
  samples["gemm_training"] = {{"shape", "1024 x 768 -> 3072, forward and backward"}, {"flops_per_s", gemm}};
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
  std::fprintf(stderr, "bench --calibrate: wrote %s (GEMM %.1f GFLOP/s, memory %.1f GB/s per rank)\n", out.c_str(),
               j["flops"]["fp32"].get<double>() / 1e9, j["memory"]["bytes_per_s"].get<double>() / 1e9);
  return 0;
}

}  // namespace mt::train
