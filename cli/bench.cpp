#include "cli/bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/calibrate.h"
#include "kernels/cpu/fma_probe.h"
#include "runtime/check.h"
#include "train/run_summary.h"
#include "train/trainer.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mt::cli {
namespace {

std::string flop_rate(double flops, double seconds) {
  if (flops <= 0 || seconds <= 0) return "-";
  const double r = flops / seconds;
  return r >= 1e12 ? strfmt("%.1f TFLOP/s", r / 1e12) : strfmt("%.1f GFLOP/s", r / 1e9);
}

// The least time an op can take on a device with these peaks: its FLOPs at the FLOP peak or its
// least memory traffic at the bandwidth, whichever is longer (the roofline). 0 when unknown.
double roofline_seconds(const ops::OpTotal& t, const plan::Peak& peak) {
  if (peak.bytes_per_s <= 0) return 0;
  return std::max(peak.flops > 0 ? t.flops / peak.flops : 0.0, t.bytes / peak.bytes_per_s);
}

// Where the measured steps' time went, op by op (profile_ops=1), the most expensive first. On a GPU
// the op times are the device's, and "of roofline" is the roofline time over the measured time: how
// close the op came to the device's FLOP peak or memory bandwidth, whichever bounds it. Rows marked
// "host:" are the step's named host work between ops (runtime/regions.h), each its own time; the last
// row is what neither an op nor a region accounts for.
void print_op_table(std::vector<ops::OpTotal> ts, double step_seconds, int steps, const plan::Peak& peak) {
  std::sort(ts.begin(), ts.end(), [](const ops::OpTotal& a, const ops::OpTotal& b) { return a.seconds > b.seconds; });
  double accounted = 0;
  for (const ops::OpTotal& t : ts) accounted += t.seconds;
  std::printf("\n| %-22s | calls/step | ms/step | share of step | rate | memory | of roofline |\n",
              "op (profile_ops=1)");
  std::printf("|------------------------|-----------:|--------:|--------------:|------|-------:|------------:|\n");
  for (const ops::OpTotal& t : ts) {
    const double roof = roofline_seconds(t, peak);
    const std::string name = t.region ? "host: " + t.op : t.op;
    std::printf("| %-22s | %10.1f | %7.2f | %12.1f%% | %s | %s | %s |\n", name.c_str(), double(t.calls) / steps,
                1e3 * t.seconds / steps, 100.0 * t.seconds / steps / step_seconds,
                flop_rate(t.flops, t.seconds).c_str(),
                t.seconds > 0 && t.bytes > 0 ? strfmt("%.0f GB/s", t.bytes / t.seconds / 1e9).c_str() : "-",
                roof > 0 && t.seconds > 0 ? strfmt("%.0f%%", 100.0 * roof / t.seconds).c_str() : "-");
  }
  const double rest = step_seconds - accounted / steps;
  std::printf("| %-22s | %10s | %7.2f | %12.1f%% | %s | %s | %s |\n", "(unaccounted)", "", 1e3 * rest,
              100.0 * rest / step_seconds, "-", "-", "-");
  if (peak.bytes_per_s > 0)
    std::printf("(roofline: %.0f TFLOP/s, %.2f TB/s; memory = least bytes moved / time)\n", peak.flops / 1e12,
                peak.bytes_per_s / 1e12);
}

// Under expert parallelism: each ep rank's time in its mixture layers' exchanges (ops::kEpExchange
// regions), summed over the measured steps. Collective over the ep group.
std::vector<double> ep_exchange_seconds(parallel::Comm& ep, const std::vector<ops::OpTotal>& totals) {
  double mine = 0;
  for (const ops::OpTotal& t : totals)
    if (t.region && t.op == ops::kEpExchange) mine += t.seconds;
  std::vector<double> seconds(size_t(ep.size()));
  for (int r = 0; r < ep.size(); r++) seconds[size_t(r)] = parallel::all_reduce_sum_double(ep, r == ep.rank() ? mine : 0.0);
  return seconds;
}

// The transfer alone: the bytes this rank sent in a step's ep all-to-alls, as one all-to-all after a
// barrier, three times. Collective over the ep group.
std::vector<double> ep_transfer_seconds(parallel::Comm& ep, const parallel::CommCounters& sent) {
  const uint64_t bytes = sent[parallel::CommOp::all_to_all].sent_bytes;
  const size_t per_peer = size_t(bytes / 4 / uint64_t(std::max(1, ep.size() - 1)));
  const std::vector<size_t> counts(size_t(ep.size()), per_peer);
  std::vector<float> send(per_peer * size_t(ep.size()), 1.f), recv(send.size());
  std::vector<double> seconds;
  for (int i = 0; i < 3; i++) {
    ep.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    ep.all_to_all_v(send.data(), counts, recv.data(), counts, DType::f32);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return seconds;
}

// Per step and ep rank: the exchange time beside the routed rows its experts drew (before capacity,
// summed over the ep groups) and, layer by layer, how many more the busiest rank's experts drew than
// its own. An exchange waits for the slowest peer, so those rows, at the experts' rate, are what a
// rank waits for; what remains of its exchange time is the transfer.
void print_ep_ranks(const std::vector<double>& seconds, const std::vector<train::StepResult>& rs, int experts) {
  const int ranks = int(seconds.size()), local = experts / ranks;
  std::vector<double> drawn(size_t(ranks), 0.0), behind(size_t(ranks), 0.0);
  for (const train::StepResult& r : rs)
    for (const auto& layer : r.moe["tokens_per_expert"]) {
      std::vector<double> load(size_t(ranks), 0.0);
      for (int e = 0; e < experts; e++) load[size_t(e / local)] += layer[size_t(e)].get<double>();
      const double most = *std::max_element(load.begin(), load.end());
      for (int k = 0; k < ranks; k++) {
        drawn[size_t(k)] += load[size_t(k)];
        behind[size_t(k)] += most - load[size_t(k)];
      }
    }
  const double steps = double(rs.size());
  std::string cells;
  for (int r = 0; r < ranks; r++)
    cells += strfmt("%sep rank %d: %.1f ms, its experts drew %.0f rows, the busiest peer's %.0f more", r ? "; " : "", r,
                    1e3 * seconds[size_t(r)] / steps, drawn[size_t(r)] / steps, behind[size_t(r)] / steps);
  std::printf("| %-22s | %s (per step, layers summed) |\n", "ep exchange per rank", cells.c_str());
}

// Rates as "206.6, 197.3, 206.2" (GFLOP/s), for the peak rows.
std::string gflops_list(const std::vector<double>& flops) {
  std::string s;
  for (double f : flops) s += strfmt("%s%.1f", s.empty() ? "" : ", ", f / 1e9);
  return s;
}

}  // namespace

int bench_main(const std::vector<std::string>& args, parallel::Comm* world, int local_rank) {
  if (std::find(args.begin(), args.end(), "--calibrate") != args.end()) {
    MT_CHECK(world != nullptr, "bench --calibrate needs the world communicator");
    return calibrate_main(args, *world, local_rank);
  }
  int warmup = kBenchWarmup;
  std::vector<std::string> rest;
  bool has_data = false, has_steps = false;
  for (const std::string& a : args) {
    if (a.rfind("warmup=", 0) == 0) {
      warmup = config::parse_int("warmup", a.substr(7));
      if (warmup < 0) fail("warmup must not be negative");
      continue;
    }
    has_data |= a.rfind("data.path=", 0) == 0 || a == "--data";
    has_steps |= a.rfind("steps=", 0) == 0 || a == "--steps";
    rest.push_back(a);
  }
  if (!has_data) rest.push_back("data.path=synthetic");
  if (!has_steps) rest.push_back(strfmt("steps=%d", kBenchSteps));
  config::TrainOptions o = config::parse_train_options(rest);
  const int measured = o.steps;
  o.steps = measured + warmup;
  o.optim.warmup_steps = 0;
  train::Trainer tr(o, world, local_rank);
  const bool print = !world || world->rank() == 0;
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  const bool on_device = o.device == Device::cuda;
  plan::Peak peak = train::run_peak(o, threads, kFirstPeakSeconds);
  // A CPU's peak is calibrated again after each measured step and the fastest reading kept. One
  // calibration runs for about a second, and on a shared machine a slower phase of a few seconds can
  // cover it, which made MFU read high (above 100% at times) while the steps ran at full speed;
  // readings spread over the steps' own window catch the speed the steps had. All ranks calibrate
  // together (between barriers), as they did before the steps, so no rank's step shares its cores
  // with another's calibration.
  const bool recalibrate = train::peak_is_measured(o);
  std::vector<double> readings{peak.flops};
  // The cores' arithmetic limit (kernels/cpu/fma_probe.h), read at the same points as the GEMM's peak.
  // Its readings after the steps also show how fast the machine ran while they did.
  cpu::FmaPeak fma;
  std::vector<double> fma_readings;
  auto read_fma = [&] {
    const cpu::FmaPeak p = cpu::measure_fma_peak(threads);
    fma_readings.push_back(p.flops);
    if (p.flops > fma.flops) fma = p;
  };
  if (!on_device) read_fma();
  std::vector<train::StepResult> rs;
  for (int i = 0; i < o.steps; i++) {
    if (i == warmup) {
      tr.arena().reset_peaks();
      if (ops::OpTimer* t = tr.op_timer()) t->reset();
    }
    train::StepResult r = tr.step();
    if (i >= warmup) rs.push_back(r);
    if (print)
      std::fprintf(stderr, "bench: step %d/%d %.3f s%s\n", i + 1, o.steps, r.t_total, i < warmup ? " (warm-up)" : "");
    if (!on_device && i >= warmup) {
      if (world) world->barrier();
      if (recalibrate) readings.push_back(train::calibrate_cpu_peak(threads, train::kPeakSeconds).flops);
      read_fma();
      if (world) world->barrier();
    }
  }
  if (recalibrate) {
    peak.flops = *std::max_element(readings.begin(), readings.end());
    peak.label += strfmt("; the fastest of %zu readings, before the steps and after each: %s", readings.size(),
                         gflops_list(readings).c_str());
  }
  // The op profile of the measured steps, taken before the blocking measurement below runs its own
  // reduction (and allocates its staging) under the same timer.
  std::vector<ops::OpTotal> op_totals;
  if (ops::OpTimer* t = tr.op_timer()) op_totals = t->totals();
  // Bytes each group sent in the last step (before the blocking measurement below adds its own).
  // The gradient group: dp, or cp x dp under context parallelism (its replicas reduce together).
  const parallel::Mesh& mesh = tr.mesh();
  parallel::Comm& dp = mesh.cp() > 1 ? mesh.cp_dp_comm() : mesh.dp_comm();
  const char* dp_name = mesh.cp() > 1 ? "cp x dp" : "dp";
  const parallel::CommCounters dp_bytes = tr.group_counters(parallel::MeshDim::dp);
  const parallel::CommCounters tp_bytes = tr.group_counters(parallel::MeshDim::tp);
  const parallel::CommCounters pp_bytes = tr.group_counters(parallel::MeshDim::pp);
  const parallel::CommCounters cp_bytes = tr.group_counters(parallel::MeshDim::cp);
  const parallel::CommCounters ep_bytes = tr.ep_counters();
  // Without overlap: the same gradient reduction, blocking, after everything else has finished, on
  // the communicator and the memory the run's reductions use (on a device: the group's NCCL
  // communicator over device buffers, timed to the device's completion).
  std::vector<double> waits, blocking;
  for (const train::StepResult& r : rs) waits.push_back(r.t_grad_wait);
  parallel::Comm* reducer = &dp;
  if (dp.size() > 1 && on_device) {
    reducer = mesh.device_comm(mesh.cp() > 1 ? parallel::MeshGroup::cp_dp : parallel::MeshGroup::dp);
    MT_CHECK(reducer != nullptr, "bench: the %s group has no device communicator", dp_name);
  }
  if (dp.size() > 1) {
    const size_t count = static_cast<size_t>(tr.params().total_numel());
    const MemOps& mem = tr.arena().mem();
    std::vector<float> host(count, 1.f);
    // Apart from the arena, whose peaks the table reports.
    float* g = on_device ? static_cast<float*>(mem.alloc(count * 4)) : host.data();
    MT_CHECK(g != nullptr, "bench: no memory for the blocking reduction's %zu floats", count);
    if (on_device) mem.upload(g, host.data(), count * 4);
    for (int i = 0; i < 3; i++) {
      mem.sync();
      dp.barrier();
      auto t0 = std::chrono::steady_clock::now();
      if (o.parallel.zero >= 2)
        reducer->reduce_scatter(g, g + size_t(dp.rank()) * (count / size_t(dp.size())), count / size_t(dp.size()),
                                DType::f32, parallel::ReduceOp::sum);
      else
        reducer->all_reduce(g, count, DType::f32, parallel::ReduceOp::sum);
      mem.sync();
      blocking.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    if (on_device) mem.free(g);
  }
  std::vector<double> ep_seconds, ep_blocking;
  if (mesh.ep() > 1 && tr.op_timer()) ep_seconds = ep_exchange_seconds(mesh.ep_comm(), op_totals);
  if (mesh.ep() > 1 && !on_device) ep_blocking = ep_transfer_seconds(mesh.ep_comm(), ep_bytes);
  if (!print) return 0;
  std::vector<double> totals;
  train::StepResult sum;
  for (const train::StepResult& r : rs) {
    totals.push_back(r.t_total);
    sum.t_data += r.t_data;
    sum.t_forward += r.t_forward;
    sum.t_backward += r.t_backward;
    sum.t_optimizer += r.t_optimizer;
    sum.t_total += r.t_total;
  }
  std::sort(totals.begin(), totals.end());
  const size_t n = totals.size();
  const double median = n % 2 ? totals[n / 2] : 0.5 * (totals[n / 2 - 1] + totals[n / 2]);
  const long tokens = rs[0].tokens;
  const double tok_s = double(tokens) / median;
  const double world_peak = peak.flops * (world ? world->size() : 1);
  const double mfu = tok_s * o.model.flops_per_token(o.seq_len) / world_peak;
  const double hfu = tok_s * model::hardware_flops_per_token(o.model, o.seq_len, o.recompute, o.attention_kind(), o.device) / world_peak;
  const MemStats& m = tr.arena().stats();
  auto pct = [&](double x) { return 100.0 * x / sum.t_total; };
  std::printf("| %-22s | %s |\n", "minitrain bench", "value");
  std::printf("|------------------------|-------|\n");
  std::printf("| %-22s | %s (%.2fM params) |\n", "model", o.model_preset.c_str(), o.model.num_params() / 1e6);
  std::printf("| %-22s | B=%d T=%d accum=%d %s recompute=%s attention=%s threads=%d |\n", "config", o.batch_size,
              o.seq_len, o.grad_accum, dtype_name(o.precision), model::recompute_name(o.recompute),
              model::attention_name(o.attention_kind()), threads);
  std::printf("| %-22s | %s, sp %s, zero %d (world %d) |\n", "layout",
              parallel::layout_name(mesh.layout()).c_str(), o.sequence_parallel() ? "on" : "off",
              o.parallel.zero, world ? world->size() : 1);
  std::printf("| %-22s | %.1f |\n", "tokens/s (median)", tok_s);
  std::printf("| %-22s | %.1f |\n", "ms/step (median)", 1e3 * median);
  std::printf("| %-22s | %.1f%% |\n", "MFU", 100 * mfu);
  std::printf("| %-22s | %.1f%% |\n", "HFU", 100 * hfu);
  std::printf("| %-22s | %.1f GFLOP/s (%s) |\n", "peak", peak.flops / 1e9, peak.label.c_str());
  const double fma_mfu =
      on_device ? 0 : tok_s * o.model.flops_per_token(o.seq_len) / (fma.flops * (world ? world->size() : 1));
  if (!on_device)
    std::printf("| %-22s | %.1f%% of %.1f GFLOP/s (%s FMAs on registers alone, %d thread%s: the cores' arithmetic "
                "limit, whatever the GEMM; the fastest of %s) |\n",
                "MFU of FMA peak", 100 * fma_mfu, fma.flops / 1e9, fma.unit, threads, threads == 1 ? "" : "s",
                gflops_list(fma_readings).c_str());
  if (mfu > 1) {
    // Two causes, both in the definition rather than the step: the peak, and attention's FLOPs. The
    // model FLOPs count the whole T x T (12 L C T a token, the usual convention), of which a causal
    // step computes about half.
    const double attention =
        12.0 * o.model.n_layer * double(o.model.n_embd) * o.seq_len / o.model.flops_per_token(o.seq_len);
    const bool given = o.peak_flops > 0;
    const std::string peak_why =
        given       ? "the peak given as peak_flops= is below what the step reached"
        : on_device ? "the datasheet peak is below what the step reached (check the GPU's name and clocks)"
                    : "the calibration GEMM ran slower than the step's products (a slow phase of the machine, or a "
                      "shape it handles less well)";
    std::string more;
    if (!on_device) more += strfmt(" MFU of FMA peak (%.1f%%) has no calibration in it.", 100 * fma_mfu);
    if (!given) more += " peak_flops=<FLOP/s> sets the peak yourself.";
    std::fprintf(stderr,
                 "bench: MFU %.1f%% is above 100%%: %s, and the model FLOPs count attention's whole T x T (%.1f%% of "
                 "them here), of which a causal step computes about half.%s\n",
                 100 * mfu, peak_why.c_str(), 100 * attention, more.c_str());
  }
  std::printf("| %-22s | data %.1f%%, forward %.1f%%, backward %.1f%%, optimizer %.1f%% |\n", "time split",
              pct(sum.t_data), pct(sum.t_forward), pct(sum.t_backward), pct(sum.t_optimizer));
  for (int c = 0; c < kNumMemCategories; c++)
    if (m.peak[size_t(c)])
      std::printf("| %-22s | %s |\n", (std::string("peak mem ") + mem_category_name(MemCategory(c))).c_str(),
                  format_bytes(m.peak[size_t(c)]).c_str());
  std::printf("| %-22s | %s |\n", "peak mem total", format_bytes(m.peak_total).c_str());
#ifdef MT_HAVE_CUDA
  if (o.device == Device::cuda) {
    // The arena counts what the run asked for; the driver's figure adds the CUDA context, cuBLASLt's
    // workspace and the blocks the stream-ordered pool keeps cached after the peak.
    const cuda::DeviceMemoryInfo dm = cuda::device_memory_info();
    std::printf("| %-22s | %s of %s (cudaMemGetInfo after the run) |\n", "device mem in use",
                format_bytes(dm.used).c_str(), format_bytes(dm.total).c_str());
  }
#endif
  // Bytes this rank sent per step, per group and collective (parallel/comm.h's sent_bytes).
  auto bytes_row = [](const char* group, const parallel::CommCounters& c) {
    std::string cells;
    for (int op = 0; op < parallel::kNumCommOps; op++) {
      const parallel::CommOpCount& k = c[parallel::CommOp(op)];
      if (k.calls)
        cells += strfmt("%s%s %s (%llu calls)", cells.empty() ? "" : ", ", parallel::comm_op_name(parallel::CommOp(op)),
                        format_bytes(k.sent_bytes).c_str(), (unsigned long long)k.calls);
    }
    std::printf("| %-22s | %s |\n", (std::string("bytes/step/rank ") + group).c_str(), cells.empty() ? "0" : cells.c_str());
  };
  if (dp.size() > 1) bytes_row(dp_name, dp_bytes);
  if (mesh.tp() > 1) bytes_row("tp", tp_bytes);
  if (mesh.pp() > 1) bytes_row("pp", pp_bytes);
  if (mesh.cp() > 1) bytes_row("cp", cp_bytes);  // ring attention
  if (mesh.ep() > 1) bytes_row("ep", ep_bytes);  // the mixture layers' token all-to-alls
  if (!ep_seconds.empty()) print_ep_ranks(ep_seconds, rs, o.model.moe.experts);
  if (!ep_blocking.empty()) {
    std::sort(ep_blocking.begin(), ep_blocking.end());
    std::printf("| %-22s | %.1f ms for a step's ep all-to-all bytes in one exchange that waits for no one "
                "(median of 3, host buffers) |\n", "ep exchange blocking", 1e3 * ep_blocking[1]);
  }
  if (dp.size() > 1) {
    std::sort(waits.begin(), waits.end());
    std::sort(blocking.begin(), blocking.end());
    std::printf("| %-22s | %s=%d zero=%d: %.1f ms exposed after backward (median%s) |\n", "grad comm wait", dp_name,
                dp.size(), o.parallel.zero, 1e3 * waits[waits.size() / 2],
                on_device ? ", the compute stream's wait between events" : "");
    std::printf("| %-22s | %.1f ms for the same reduction with nothing to overlap (median of 3, %s) |\n",
                "grad comm blocking", 1e3 * blocking[1], on_device ? "NCCL on device buffers" : "host buffers");
  }
  if (tr.op_timer()) print_op_table(std::move(op_totals), sum.t_total / double(n), int(n), peak);
  if (o.trace.on) tr.write_trace(o.out_dir + "/trace");  // the bench's steps are counted as the trainer's
  return 0;
}

}  // namespace mt::cli
