#include "cli/calibrate.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include "checkpoint/fsio.h"
#include "cli/selftest.h"
#include "config/options.h"
#include "kernels/cuda_available.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "plan/hardware.h"
#include "runtime/check.h"
#include "runtime/storage.h"
#include "train/metrics.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif
#ifdef MT_HAVE_NCCL
#include "parallel/nccl_comm.h"
#endif

namespace mt::cli {
namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// Where the measurements run: the ops' backend and the memory their buffers live in. On a GPU the
// shapes are larger (the kernels must run long enough for a host clock to time them) and every timed
// call is followed by a wait for the device.
struct Target {
  const MemOps& mem;
  ops::Ctx ctx;
  CalibrationShape shape;
  bool gpu() const { return ctx.device == Device::cuda; }
};

// n elements of T in the target's memory (zero-filled, or a copy of `init`), freed on scope exit. No
// elements, no memory: device memory then gives a null pointer.
template <class T>
class Block {
 public:
  Block(const Target& t, size_t n, const std::vector<T>& init = {}) : mem_(t.mem), p_(static_cast<T*>(t.mem.alloc(n * sizeof(T)))) {
    MT_CHECK(n == 0 || p_ != nullptr, "bench --calibrate: out of memory allocating %zu bytes", n * sizeof(T));
    if (!init.empty()) mem_.upload(p_, init.data(), std::min(n, init.size()) * sizeof(T));
  }
  ~Block() { mem_.free(p_); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  T* get() const { return p_; }

 private:
  const MemOps& mem_;
  T* p_;
};

// Best time of `reps` runs of f after one untimed run (the GPU's first call loads its kernels).
template <class F>
double best_of(const Target& t, int reps, F f) {
  f();
  t.mem.sync();
  double best = 1e30;
  for (int rep = 0; rep < reps; rep++) {
    const auto t0 = clock_type::now();
    f();
    t.mem.sync();
    best = std::min(best, since(t0));
  }
  return best;
}

// Small values, varied so that no kernel sees a constant (softmax ties, zero gradients).
template <class S>
std::vector<S> ramp(size_t n) {
  std::vector<S> v(n);
  for (size_t i = 0; i < n; i++) v[i] = store_as<S>(0.01f * float(int(i % 97) - 48));
  return v;
}

// The rate of a transformer layer's GEMMs in storage type S: the four weighted products (C -> 3C, C -> C,
// C -> 4C, 4C -> C) on `rows` rows, forward and backward (input and weight gradients), 72 rows C^2
// FLOPs, through the model's own matmul ops; best of several. Square 1024^3 products run faster than
// the trainer's, so this is what a plan uses.
template <class S>
double training_gemm_rate(const Target& t) {
  const int N = t.shape.rows, C = t.shape.n_embd;
  const std::pair<int, int> dims[] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
  Block<S> in(t, size_t(N) * 4 * C, ramp<S>(size_t(N) * 4 * C)), w(t, size_t(4) * C * C, ramp<S>(size_t(4) * C * C)),
      out(t, size_t(N) * 4 * C), din(t, size_t(N) * 4 * C);
  Block<float> dw(t, size_t(4) * C * C);
  return 72.0 * N * double(C) * C / best_of(t, 4, [&] {
    for (const auto& [IC, OC] : dims) {
      ops::matmul_fwd<S>(out.get(), in.get(), w.get(), nullptr, N, IC, OC, t.ctx);
      ops::matmul_bwd<S>(din.get(), dw.get(), nullptr, out.get(), in.get(), w.get(), N, IC, OC, t.ctx);
    }
  });
}

// Bytes read plus written per second by a copy of 256 MiB: on a CPU a parallel loop over the ranks'
// threads, on a GPU a device-to-device copy. Best of several.
double memory_bandwidth(const Target& t) {
  const size_t n = size_t(32) << 20;  // doubles: 256 MiB each way
  if (t.gpu()) {
    Block<double> a(t, n), b(t, n);
    return 2.0 * double(n) * sizeof(double) / best_of(t, 6, [&] { t.mem.move(b.get(), a.get(), n * sizeof(double)); });
  }
  std::vector<double> a(n, 1.0), b(n, 0.0);
  int rep = 0;
  const double best = best_of(t, 6, [&] {
    rep++;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < long(n); i++) b[size_t(i)] = a[size_t(i)] + 1e-9 * double(rep);
  });
  if (b[n / 2] < 0) std::puts("");  // keep the copy
  return 2.0 * double(n) * sizeof(double) / best;
}

// The attention kernels' forward and backward (materialized or flash) in storage type S, in FLOPs of
// the planner's formula (train/metrics.h model::attention_flops_per_token) per second.
template <class S>
double attention_rate(const Target& t, bool flash) {
  const int T = t.shape.seq_len, B = std::max(1, t.shape.rows / T), C = t.shape.n_embd, NH = t.shape.n_head;
  model::GPTConfig cfg;
  cfg.n_layer = 1;
  cfg.n_embd = C;
  cfg.n_head = NH;
  const model::Attention a = flash ? model::Attention::flash : model::Attention::materialized;
  const double flops = model::attention_flops_per_token(cfg, T, model::Recompute::none, a, t.ctx.device) * B * T;
  const size_t rows = size_t(B) * T, probs = flash ? size_t(B) * NH * T : size_t(B) * NH * T * T;
  Block<S> qkv(t, rows * 3 * C, ramp<S>(rows * 3 * C)), out(t, rows * C), dout(t, rows * C, ramp<S>(rows * C)),
      dqkv(t, rows * 3 * C), att(t, flash ? 0 : probs);
  Block<float> lse(t, flash ? probs : 0), scratch(t, probs);
  return flops / best_of(t, 3, [&] {
    if (flash) {
      ops::flash_attention_fwd<S>(out.get(), lse.get(), qkv.get(), nullptr, B, T, C, NH, t.ctx);
      ops::flash_attention_bwd<S>(dqkv.get(), scratch.get(), dout.get(), qkv.get(), out.get(), lse.get(), nullptr, B,
                                  T, C, NH, t.ctx);
    } else {
      ops::attention_fwd<S>(out.get(), att.get(), qkv.get(), nullptr, B, T, C, NH, t.ctx);
      ops::attention_bwd<S>(dqkv.get(), scratch.get(), dout.get(), qkv.get(), att.get(), nullptr, B, T, C, NH, t.ctx);
    }
  });
}

// Elements of the vector ops' buffers: 4 Mi (optimizer) and 16 Mi (reduction) on a CPU, 16x that on a GPU.
int64_t vector_elements(const Target& t, int64_t cpu) { return t.gpu() ? 16 * cpu : cpu; }

// AdamW, in the planner's 32 bytes per element (plan/cost.cpp), per second.
double optimizer_rate(const Target& t) {
  const int64_t n = vector_elements(t, int64_t(4) << 20);
  Block<float> p(t, size_t(n)), m(t, size_t(n)), v(t, size_t(n)), g(t, size_t(n), ramp<float>(size_t(n)));
  int step = 0;
  return 32.0 * double(n) / best_of(t, 4, [&] {
    ops::adamw(p.get(), m.get(), v.get(), g.get(), n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step, t.ctx);
  });
}

// A sum of squares over fp32 values (the gradient norms), in bytes read per second.
double reduction_rate(const Target& t) {
  const int64_t n = vector_elements(t, int64_t(16) << 20);
  Block<float> g(t, size_t(n), ramp<float>(size_t(n)));
  Block<double> sum(t, 1);
  return 4.0 * double(n) / best_of(t, 4, [&] { ops::sum_squares_into(sum.get(), g.get(), n, false, t.ctx); });
}

// Ping-pong between ranks 0 and 1 of `c` (messages of 2-byte elements in the target's memory); the
// others wait at the barrier.
nlohmann::json ping_pong(parallel::Comm& c, const Target& t, plan::LinkSpec& link) {
  nlohmann::json samples = nlohmann::json::array();
  const size_t max_bytes = size_t(16) << 20;
  Block<char> buf(t, max_bytes);
  for (size_t bytes = 8; bytes <= max_bytes; bytes *= 8) {
    const int reps = bytes < (size_t(1) << 20) ? 200 : 10;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
      c.barrier();
      const auto t0 = clock_type::now();
      if (c.rank() == 0) {
        c.send(buf.get(), bytes / 2, DType::u16, 1);
        c.recv(buf.get(), bytes / 2, DType::u16, 1);
      } else if (c.rank() == 1) {
        c.recv(buf.get(), bytes / 2, DType::u16, 0);
        c.send(buf.get(), bytes / 2, DType::u16, 0);
      }
      t.mem.sync();
      best = std::min(best, since(t0) / 2);  // one way
    }
    samples.push_back({{"bytes", bytes}, {"one_way_s", best}, {"bytes_per_s", double(bytes) / best}});
    if (bytes == 8) link.latency_s = best;
    link.bytes_per_s = double(bytes) / best;
  }
  return samples;
}

// Every figure but the links, on every rank at once (each rank's share of the machine); the slowest
// rank's figure is kept: a plan must hold on every rank. S: the storage type of the GEMM and
// attention kernels (fp32 on a CPU, whose backend computes in fp32 for every type; bf16 on a GPU).
template <class S>
void measure_chip(parallel::Comm& world, const Target& t, plan::Hardware& h, nlohmann::json& samples) {
  world.barrier();
  const double gemm = training_gemm_rate<S>(t);
  const double gemm32 = t.gpu() ? training_gemm_rate<float>(t) : gemm;
  world.barrier();
  const double bw = memory_bandwidth(t);
  world.barrier();
  const double attention = attention_rate<S>(t, false), flash = attention_rate<S>(t, true);
  world.barrier();
  const double optimizer = optimizer_rate(t), reduction = reduction_rate(t);
  float mins[7] = {float(-gemm),      float(-gemm32),    float(-bw),        float(-attention),
                   float(-flash),     float(-optimizer), float(-reduction)};
  world.all_reduce(mins, 7, DType::f32, parallel::ReduceOp::max);  // the maximum of the negated figures
  h.flops_bf16 = h.flops_fp16 = -double(mins[0]);
  h.flops_fp32 = -double(mins[1]);
  h.memory_bytes_per_s = -double(mins[2]);
  h.attention_flops_per_s = -double(mins[3]);
  h.flash_attention_flops_per_s = -double(mins[4]);
  h.optimizer_bytes_per_s = -double(mins[5]);
  h.reduction_bytes_per_s = -double(mins[6]);
  const CalibrationShape& a = t.shape;
  samples["gemm_training"] = {
      {"shape", strfmt("a layer's four weighted products at %d rows, C %d, forward and backward", a.rows, a.n_embd)},
      {"dtype", dtype_name(dtype_of<S>())},
      {"flops_per_s", gemm}};
  if (t.gpu()) samples["gemm_training_fp32"] = {{"flops_per_s", gemm32}};
  samples["ops"] = {
      {"attention", strfmt("forward and backward, B %d, T %d, C %d, %d heads, causal, %s", std::max(1, a.rows / a.seq_len),
                           a.seq_len, a.n_embd, a.n_head, dtype_name(dtype_of<S>()))},
      {"optimizer", strfmt("AdamW over %lld fp32 parameters", (long long)vector_elements(t, int64_t(4) << 20))},
      {"reduction", strfmt("sum of squares over %lld fp32 values", (long long)vector_elements(t, int64_t(16) << 20))}};
}

}  // namespace

// What the GEMM and attention figures were measured on, for the file's source.
std::string shapes(const CalibrationShape& c, const char* dtypes) {
  return strfmt("GEMM: the model's %s matmuls forward and backward, a layer's four products at %d rows, C %d; "
                "attention at T %d, %d heads", dtypes, c.rows, c.n_embd, c.seq_len, c.n_head);
}

CalibrationShape CalibrationShape::defaults(Device device) {
  return device == Device::cuda ? CalibrationShape{16384, 1024, 768, 12} : CalibrationShape{1024, 256, 768, 12};
}

nlohmann::json calibrate_hardware(parallel::Comm& world, int threads, Device device, const CalibrationShape& shape,
                                  int local_rank) {
  if (threads > 0) omp_set_num_threads(threads);
  const int nt = omp_get_max_threads();
  nlohmann::json samples = nlohmann::json::object();
  plan::Hardware h;
  if (device == Device::cpu) {
    world.barrier();
    const plan::Peak square = train::calibrate_cpu_peak(nt);  // every rank at once: each rank's share of the cores
    samples["gemm_square"] = {{"label", square.label}, {"flops_per_s", square.flops}};
    h = plan::resolve_hardware("cpu");
    h.name = "cpu-calibrated";
    measure_chip<float>(world, Target{host_memory(), ops::Ctx{}, shape}, h, samples);
    const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
    h.memory_bytes = phys / world.size();
    h.chips_per_node = world.size();
    if (world.size() > 1) {
      samples["mpi_ping_pong"] = ping_pong(world, Target{host_memory(), ops::Ctx{}, shape}, h.intra);
      h.inter = h.intra;
      h.source = strfmt("measured by minitrain bench --calibrate: %d ranks x %d threads; %s; memory: a parallel copy "
                        "of 256 MiB; links: MPI ping-pong between ranks 0 and 1 (one machine: inter = intra)",
                        world.size(), nt, shapes(shape, "fp32").c_str());
    } else {
      h.source = strfmt("measured by minitrain bench --calibrate: 1 rank x %d threads; %s; memory: a parallel copy of "
                        "256 MiB; links not measured (one rank): the built-in cpu entry's",
                        nt, shapes(shape, "fp32").c_str());
    }
  } else {
#ifdef MT_HAVE_CUDA
    const std::string why = ops::cuda_unavailable_reason();
    if (!why.empty()) fail("bench --calibrate device=cuda: %s", why.c_str());
    cuda::set_device((local_rank >= 0 ? local_rank : world.rank()) % cuda::device_count());
    const Target t{cuda::device_memory(), ops::Ctx{Device::cuda}, shape};
    // The built-in GPU entries' assumptions stand for what one process cannot measure: the share of the
    // gradient traffic hidden behind backward, and the link between nodes.
    h = plan::resolve_hardware("h100");
    h.name = "gpu-calibrated";
    h.device = Device::cuda;
    measure_chip<bf16>(world, t, h, samples);
    h.memory_bytes = double(cuda::device_memory_info().total);
    h.chips_per_node = world.size();
    std::string links = "links not measured (one rank): the built-in h100 entry's";
#ifdef MT_HAVE_NCCL
    if (world.size() > 1) {
      parallel::NcclComm nccl(world, nullptr, "calibrate.nccl");
      samples["nccl_ping_pong"] = ping_pong(nccl, t, h.intra);
      links = "links: NCCL ping-pong between ranks 0 and 1 (intra); inter: the built-in h100 entry's";
    }
#endif
    h.source = strfmt("measured by minitrain bench --calibrate device=cuda: %d ranks, one GPU each; %s; memory: a "
                      "device-to-device copy of 256 MiB; %s; dp_overlap assumed as the built-in GPU entries'",
                      world.size(), shapes(shape, "bf16 (fp16 taken as bf16) and fp32").c_str(), links.c_str());
#else
    (void)local_rank;
    fail("bench --calibrate device=cuda: this build has no CUDA (configure with -DMT_CUDA=ON)");
#endif
  }
  nlohmann::json j = h.to_json();
  j["samples"] = samples;
  return j;
}

int calibrate_main(const std::vector<std::string>& args, parallel::Comm& world, int local_rank) {
  std::string out;
  int threads = 0;
  Device device = Device::cpu;
  for (const std::string& a : args)
    if (a.rfind("device=", 0) == 0) device = device_from_name(a.substr(7));
  CalibrationShape shape = CalibrationShape::defaults(device);
  const std::pair<const char*, int*> dims[] = {
      {"rows", &shape.rows}, {"seq_len", &shape.seq_len}, {"n_embd", &shape.n_embd}, {"n_head", &shape.n_head}};
  for (const std::string& a : args) {
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq), value = eq == std::string::npos ? "" : a.substr(eq + 1);
    bool known = a == "--calibrate" || key == "device";
    if (key == "out") out = value, known = true;
    if (key == "threads") threads = config::parse_int("threads", value), known = true;
    for (const auto& [name, v] : dims)
      if (key == name) *v = config::parse_int(name, value), known = true;
    if (!known)
      fail("bench --calibrate: unexpected argument '%s' (expected out=FILE, threads=N, device=cpu|cuda, rows=N, "
           "seq_len=T, n_embd=C, n_head=H)", a.c_str());
  }
  if (threads < 0) fail("threads must not be negative (got %d)", threads);
  for (const auto& [name, v] : dims)
    if (*v <= 0) fail("bench --calibrate: %s must be positive (got %d)", name, *v);
  if (shape.n_embd % shape.n_head != 0)
    fail("bench --calibrate: n_embd %d is not divisible by n_head %d", shape.n_embd, shape.n_head);
  const nlohmann::json j = calibrate_hardware(world, threads, device, shape, local_rank);
  if (world.rank() != 0) return 0;
  const std::string text = j.dump(2) + "\n";
  if (out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  checkpoint::io::write_file_atomically(out, text);
  plan::hardware_from_json(j, out);  // what plan will read back
  const nlohmann::json& r = j["ops"];
  std::fprintf(stderr,
               "bench --calibrate: wrote %s (per rank: GEMM %.1f GFLOP/s fp32, attention %.1f / flash %.1f GFLOP/s, memory "
               "%.1f GB/s, optimizer %.1f GB/s, norms %.1f GB/s)\n",
               out.c_str(), j["flops"]["fp32"].get<double>() / 1e9, r["attention_flops_per_s"].get<double>() / 1e9,
               r["flash_attention_flops_per_s"].get<double>() / 1e9, j["memory"]["bytes_per_s"].get<double>() / 1e9,
               r["optimizer_bytes_per_s"].get<double>() / 1e9, r["reduction_bytes_per_s"].get<double>() / 1e9);
  return 0;
}

}  // namespace mt::cli
