// Per-step metrics: one JSON object per line in <out_dir>/metrics.jsonl, the memory record, and the
// CPU's peak for MFU (a calibration GEMM; a GPU's comes from the datasheet table, plan/hardware.h).
// The FLOP formulas behind MFU and HFU are the model's (model/config.h).
#pragma once
#include <cstdio>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "plan/hardware.h"
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

// The peak of this CPU: the best rate of a square fp32 GEMM through the model's matmul op, over at
// least min_seconds of repetitions.
plan::Peak calibrate_cpu_peak(int threads, double min_seconds = 1.0);
nlohmann::json memory_json(const MemStats& s);

}  // namespace mt::train
