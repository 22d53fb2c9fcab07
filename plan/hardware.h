// Hardware descriptions for `minitrain plan`: what one chip can do (peak FLOP/s per dtype, memory
// bandwidth and capacity) and what the links between chips carry (bandwidth and latency inside a
// node and between nodes), for the planner's alpha-beta and roofline models (plan/cost.h).
//
// Built-in entries (hardware_names()): h100, h200 and a100 from NVIDIA's public datasheets for the
// SXM parts (dense figures, i.e. without 2:4 sparsity), and `cpu`, nominal figures for a small x86
// server meant to be replaced by a calibrated file (`minitrain bench --calibrate out=FILE` measures
// the machine it runs on). A file holds one JSON object:
//
//   {"name": "...", "source": "...",
//    "flops": {"fp32": 6.7e13, "bf16": 9.89e14, "fp16": 9.89e14},   FLOP/s per chip, per compute dtype
//    "memory": {"bytes": 8.0e10, "bytes_per_s": 3.35e12},           capacity and bandwidth per chip
//    "chips_per_node": 8,
//    "links": {"intra": {"bytes_per_s": 4.5e11, "latency_s": 3e-6},  per direction, per chip
//              "inter": {"bytes_per_s": 5.0e10, "latency_s": 1e-5}},
//    "dp_overlap": 0.9,                                             share of the data-parallel
//                                                                   reduction hidden behind backward
//    "device": "cuda",                                              the backend it runs (cuda | cpu)
//    "ops": {"attention_flops_per_s": 2.0e10,                       optional: rates of the ops the
//            "flash_attention_flops_per_s": 1.5e10,                 backend runs below its GEMM peak or
//            "optimizer_bytes_per_s": 5e9,                          memory bandwidth, each by the plan's
//            "reduction_bytes_per_s": 4e9}}                         own count (plan/cost.cpp)
//
// and optionally "samples": the calibration's raw measurements (kept for the record, not read).
// Every field is required except source, dp_overlap (default 0), device (default cuda), ops (each rate
// defaults to the GEMM peak or the memory bandwidth) and samples; a missing or ill-typed one is an
// error naming the file and the field. A calibrated CPU file measures every "ops" rate: there softmax,
// the exponentials of attention and the optimizer's square roots run at a fraction of the GEMM rate
// and of the copy bandwidth; the datasheet entries leave them out.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace mt::plan {

struct LinkSpec {
  double bytes_per_s = 0;  // per direction, per chip
  double latency_s = 0;    // per message (the alpha of the alpha-beta model)
};

struct Hardware {
  std::string name;
  std::string source;  // where the figures come from (datasheet, calibration command)
  double flops_fp32 = 0, flops_bf16 = 0, flops_fp16 = 0;
  double memory_bytes = 0;        // capacity per chip
  double memory_bytes_per_s = 0;  // bandwidth per chip
  int chips_per_node = 1;
  LinkSpec intra, inter;
  Device device = Device::cuda;  // the backend the planner models (flash attention, logits chunks)
  double dp_overlap = 0;  // share of the data-parallel gradient traffic hidden behind backward, [0, 1]
  // Measured op rates ("ops"; 0 = not measured, the peak or the bandwidth stands in).
  double attention_flops_per_s = 0, flash_attention_flops_per_s = 0;  // the formula's FLOPs per second
  double optimizer_bytes_per_s = 0;  // AdamW, by the plan's bytes per element (plan/cost.cpp)
  double reduction_bytes_per_s = 0;  // a sum of squares over fp32 gradients: 4 bytes read per element

  double flops_for(DType compute) const;  // the peak of the run's compute dtype
  // The attention kernels' rate (materialized or flash), measured or the peak.
  double attention_flops_for(bool flash, DType compute) const;
  double optimizer_rate() const { return optimizer_bytes_per_s > 0 ? optimizer_bytes_per_s : memory_bytes_per_s; }
  double reduction_rate() const { return reduction_bytes_per_s > 0 ? reduction_bytes_per_s : memory_bytes_per_s; }
  // The link a group of `span` consecutive ranks (tp innermost) crosses: intra when it fits a node.
  const LinkSpec& link_for_span(int span) const { return span <= chips_per_node ? intra : inter; }
  nlohmann::json to_json() const;
};

// The built-in names, in the order `plan --help` lists them.
std::vector<std::string> hardware_names();
// A built-in entry, or a file when `spec` is not one of the names; throws one line naming the
// unknown name (with the known ones) or the file and its bad field.
Hardware resolve_hardware(const std::string& spec);
// Parses a hardware object; `origin` names it in errors (a file's path).
Hardware hardware_from_json(const nlohmann::json& j, const std::string& origin);
Hardware load_hardware_file(const std::string& path);

// The peak used for MFU: a GPU's datasheet entry (bf16 dense), or on the CPU the measured rate of a
// calibration GEMM (train/metrics.h). `label` says which.
struct Peak {
  double flops = 0;
  std::string label;
  double bytes_per_s = 0;  // memory bandwidth (datasheet) where known, else 0
};
// The datasheet entry whose key ("H200", "A100", ...) the device's name contains; flops 0 if none.
// The same table gives the built-in h100, h200 and a100 their chip figures.
Peak gpu_peak_from_name(const std::string& device_name);

}  // namespace mt::plan
