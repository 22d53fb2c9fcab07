// Per-step metrics: one JSON object per line in <out_dir>/metrics.jsonl, and a one-line human
// progress display with ETA on stderr. Also the throughput arithmetic (MFU, HFU) and the CPU peak
// calibration.
#pragma once
#include <cstdio>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "model/gpt.h"
#include "runtime/arena.h"

namespace mt::train {

// Appends JSON lines to a file (metrics.jsonl) so that every line a reader sees is a whole record:
// each record goes out in one write(2) and reaches the kernel before write() returns, so a killed run
// keeps every completed step; a failed write (a full disk) throws naming the file and errno, after
// cutting off whatever part of the record did reach the file; opening to append cuts a torn last
// line (a run killed mid-write) and says so in cut_bytes().
class JsonlWriter {
 public:
  JsonlWriter() = default;
  JsonlWriter(const std::string& path, bool append);
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  JsonlWriter(JsonlWriter&& o) noexcept { *this = std::move(o); }
  JsonlWriter& operator=(JsonlWriter&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(path_, o.path_);
    std::swap(size_, o.size_);
    std::swap(cut_, o.cut_);
    std::swap(regular_, o.regular_);
    return *this;
  }
  ~JsonlWriter();
  void write(const nlohmann::json& j);  // throws mt::Error "writing <path>: <reason> (errno N)"
  uint64_t cut_bytes() const { return cut_; }

 private:
  int fd_ = -1;
  std::string path_;
  uint64_t size_ = 0;     // the file's length after the last whole record
  uint64_t cut_ = 0;
  bool regular_ = false;  // a regular file (not a pipe or device), which can be cut
};

// FLOPs per token that the hardware executes, including activation recomputation: full recompute
// re-runs each layer's forward (2 N_layers + 4 L C T), selective re-runs the attention core (4 L C T),
// and the flash backward recomputes one (CPU) or three (GPU) of the attention products (2 L C T each).
double hardware_flops_per_token(const model::GPTConfig& cfg, int T, model::Recompute r,
                                model::Attention a = model::Attention::materialized, Device device = Device::cpu);
// The attention products' share of it (12 L C T without recompute): the part the planner times at the
// attention kernels' rate rather than the GEMMs'.
double attention_flops_per_token(const model::GPTConfig& cfg, int T, model::Recompute r, model::Attention a,
                                 Device device);

// The peak used for MFU: a GPU table entry (bf16 dense), or on CPU the measured rate of a
// calibration GEMM. `label` says which.
struct Peak {
  double flops = 0;
  std::string label;
  double bytes_per_s = 0;  // memory bandwidth (datasheet) where known, else 0
};
Peak calibrate_cpu_peak(int threads);
Peak gpu_peak_from_name(const std::string& device_name);  // 0 if unknown

nlohmann::json memory_json(const MemStats& s);
std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

}  // namespace mt::train
