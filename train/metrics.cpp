#include "train/metrics.h"

#include <chrono>
#include <vector>

#include "kernels/ops.h"
#include "runtime/check.h"

namespace mt::train {

JsonlWriter::JsonlWriter(const std::string& path, bool append) {
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f_) fail("cannot open metrics file '%s' for writing", path.c_str());
}

JsonlWriter::~JsonlWriter() {
  if (f_) std::fclose(f_);
}

void JsonlWriter::write(const nlohmann::json& j) {
  if (!f_) return;
  std::string s = j.dump();
  std::fprintf(f_, "%s\n", s.c_str());
  std::fflush(f_);
}

double hardware_flops_per_token(const model::GPTConfig& cfg, int T, model::Recompute r, model::Attention a,
                                Device device) {
  const double C = cfg.n_embd, L = cfg.n_layer;
  double f = cfg.flops_per_token(T);
  const double attn_fwd = 4.0 * L * C * T;  // Q K^T and P V
  if (r == model::Recompute::full) f += 2.0 * (12.0 * L * C * C) + attn_fwd;
  if (a == model::Attention::flash) {
    // The flash backward recomputes what it did not store. The CPU's recomputes Q K^T once
    // (kernels/cpu/flash_attention.cpp). The GPU's runs two kernels so that no sum needs atomics
    // (kernels/cuda/flash_attention*.cu): Q K^T in both and dO V^T again in the second. Each product
    // is attn_fwd / 2. There is no separate selective recompute.
    f += (device == Device::cuda ? 3 : 1) * attn_fwd / 2;
  } else if (r == model::Recompute::selective) {
    f += attn_fwd;
  }
  return f;
}

Peak calibrate_cpu_peak(int threads) {
  // A square fp32 GEMM through the same matmul op the model uses; best of a few repetitions.
  const int n = 1024;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  ops::Ctx ctx;
  ops::matmul_fwd<float>(c.data(), a.data(), b.data(), nullptr, n, n, n, ctx);  // warm-up
  // Best of at least 8 repetitions and one second: the peak is what the GEMM reaches when it has
  // the cores to itself, so a momentarily busy machine must not lower it (MFU would read high).
  double best = 1e30, spent = 0;
  for (int rep = 0; rep < 8 || spent < 1.0; rep++) {
    auto t0 = std::chrono::steady_clock::now();
    ops::matmul_fwd<float>(c.data(), a.data(), b.data(), nullptr, n, n, n, ctx);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, t);
    spent += t;
    if (rep > 200) break;
  }
  Peak p;
  p.flops = 2.0 * n * n * double(n) / best;
  p.label = strfmt("calibrated CPU fp32 GEMM %dx%dx%d, %d threads", n, n, n, threads);
  return p;
}

Peak gpu_peak_from_name(const std::string& name) {
  // Dense bf16 tensor-core peaks and memory bandwidths from the vendors' datasheets (SXM parts for
  // H100 and A100 80GB; the PCIe variants have less bandwidth).
  struct Row {
    const char* key;
    double tflops, tb_per_s;
  };
  static const Row table[] = {{"H200", 989, 4.8},    {"H100", 989, 3.35}, {"A100", 312, 2.039},
                              {"L40S", 362, 0.864}, {"A10", 125, 0.6}};
  for (const Row& r : table)
    if (name.find(r.key) != std::string::npos)
      return {r.tflops * 1e12, strfmt("%s bf16 dense peak (datasheet)", r.key), r.tb_per_s * 1e12};
  return {0, "unknown GPU"};
}

nlohmann::json memory_json(const MemStats& s) {
  nlohmann::json j;
  for (int i = 0; i < kNumMemCategories; i++) j[mem_category_name(MemCategory(i))] = s.peak[size_t(i)];
  j["total"] = s.peak_total;
  return j;
}

std::string format_duration(double s) {
  if (s < 0 || s > 1e9) return "?";
  long t = long(s + 0.5);
  if (t >= 3600) return strfmt("%ldh%02ldm", t / 3600, (t % 3600) / 60);
  if (t >= 60) return strfmt("%ldm%02lds", t / 60, t % 60);
  return strfmt("%lds", t);
}

}  // namespace mt::train
