#include "plan/hardware.h"

#include <fstream>
#include <utility>
#include <vector>

#include "config/limits.h"
#include "runtime/check.h"

namespace mt::plan {
namespace {

// One table of datasheet figures (dense, i.e. without 2:4 sparsity; SXM parts for H100, H200 and
// A100 80GB): the built-in hardware entries below take their chip figures from it, and a run's MFU
// peak on a GPU is its bf16 entry. 0: not listed (the L40S and A10 are known to MFU only).
struct Datasheet {
  const char* key;  // found in the device's name
  double flops_fp32, flops_bf16, memory_bytes, memory_bytes_per_s;
};
constexpr Datasheet kDatasheets[] = {
    {"H200", 67e12, 989.5e12, 141e9, 4.8e12},  {"H100", 67e12, 989.5e12, 80e9, 3.35e12},
    {"A100", 19.5e12, 312e12, 80e9, 2.039e12}, {"L40S", 0, 362e12, 0, 0.864e12},
    {"A10", 0, 125e12, 0, 0.6e12},
};

const Datasheet& datasheet(const char* key) {
  for (const Datasheet& d : kDatasheets)
    if (std::string(d.key) == key) return d;
  fail("no datasheet entry '%s'", key);
}

// The chip's figures of a datasheet entry.
void set_chip(Hardware& h, const Datasheet& d) {
  h.flops_fp32 = d.flops_fp32;
  h.flops_bf16 = h.flops_fp16 = d.flops_bf16;
  h.memory_bytes = d.memory_bytes;
  h.memory_bytes_per_s = d.memory_bytes_per_s;
}

// Link latencies are not on the datasheets: 3 us inside a node (NVLink/NVSwitch) and 10 us between
// nodes (InfiniBand) are the planner's assumptions, the order of NCCL's small-message latency.
Hardware h100() {
  Hardware h;
  h.name = "h100";
  h.source = "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: FP32 67 TFLOP/s, BF16/FP16 989.5 TFLOP/s dense "
             "(1979 with sparsity), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s (450 each way); DGX H100 datasheet: "
             "one 400 Gb/s ConnectX-7 port per GPU; latencies assumed";
  set_chip(h, datasheet("H100"));
  h.chips_per_node = 8;
  h.intra = {450e9, 3e-6};
  h.inter = {50e9, 10e-6};
  h.dp_overlap = 0.9;
  return h;
}

Hardware h200() {
  Hardware h = h100();
  h.name = "h200";
  h.source = "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: FP32 67 TFLOP/s, BF16/FP16 989.5 TFLOP/s dense "
             "(1979 with sparsity), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s (450 each way); one 400 Gb/s "
             "InfiniBand port per GPU assumed (as DGX H100); latencies assumed";
  set_chip(h, datasheet("H200"));
  return h;
}

Hardware a100() {
  Hardware h;
  h.name = "a100";
  h.source = "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM: FP32 19.5 TFLOP/s, BF16/FP16 312 TFLOP/s "
             "dense (624 with sparsity), 80 GB HBM2e at 2039 GB/s, NVLink 600 GB/s (300 each way); DGX A100 "
             "datasheet: one 200 Gb/s HDR InfiniBand port per GPU; latencies assumed";
  set_chip(h, datasheet("A100"));
  h.chips_per_node = 8;
  h.intra = {300e9, 3e-6};
  h.inter = {25e9, 10e-6};
  h.dp_overlap = 0.9;
  return h;
}

// A chip here is one rank of a CPU run. Round figures for a small x86 server, to be replaced by a
// calibrated file: the CPU backend computes in fp32 whatever the storage type, and its MPI reductions
// progress only inside MPI calls, so nothing of the gradient traffic overlaps backward.
Hardware cpu() {
  Hardware h;
  h.name = "cpu";
  h.source = "nominal small x86 server (round figures, not measured): calibrate with minitrain bench --calibrate";
  h.flops_fp32 = h.flops_bf16 = h.flops_fp16 = 50e9;
  h.memory_bytes = 16.0 * (1ull << 30);
  h.memory_bytes_per_s = 10e9;
  h.chips_per_node = 2;
  h.intra = {5e9, 1e-6};
  h.inter = {1.25e9, 20e-6};
  h.dp_overlap = 0;
  h.device = Device::cpu;
  return h;
}

constexpr double kMaxFigure = 1e18;

const nlohmann::json& field(const nlohmann::json& j, const std::string& path, const char* key,
                            const std::string& origin) {
  if (!j.is_object() || !j.contains(key))
    fail("hardware file '%s': missing field '%s%s'", origin.c_str(), path.c_str(), key);
  return j.at(key);
}

double number(const nlohmann::json& j, const std::string& path, const char* key, const std::string& origin,
              bool positive = true) {
  const nlohmann::json& v = field(j, path, key, origin);
  if (!v.is_number())
    fail("hardware file '%s': field '%s%s' must be a number (got %s)", origin.c_str(), path.c_str(), key,
         v.dump().c_str());
  const double x = v.get<double>();
  if (positive ? !(x > 0) : !(x >= 0))
    fail("hardware file '%s': field '%s%s' must be %s (got %g)", origin.c_str(), path.c_str(), key,
         positive ? "positive" : "non-negative", x);
  // Bytes and rates past 1e18 (an exabyte, an exaFLOP/s per chip) would wrap the planner's 64-bit byte counts.
  if (x > kMaxFigure)
    fail("hardware file '%s': field '%s%s' must be at most %g (got %g)", origin.c_str(), path.c_str(), key, kMaxFigure, x);
  return x;
}

// The optional "ops" rates, by their names in the file.
template <class H>
auto op_rates(H& h) {
  using D = decltype(&h.attention_flops_per_s);
  return std::vector<std::pair<const char*, D>>{{"attention_flops_per_s", &h.attention_flops_per_s},
                                                {"flash_attention_flops_per_s", &h.flash_attention_flops_per_s},
                                                {"optimizer_bytes_per_s", &h.optimizer_bytes_per_s},
                                                {"reduction_bytes_per_s", &h.reduction_bytes_per_s}};
}

LinkSpec link(const nlohmann::json& j, const char* key, const std::string& origin) {
  const nlohmann::json& l = field(j, "links.", key, origin);
  const std::string path = std::string("links.") + key + ".";
  return {number(l, path, "bytes_per_s", origin), number(l, path, "latency_s", origin, false)};
}

}  // namespace

double Hardware::flops_for(DType compute) const {
  return compute == DType::bf16 ? flops_bf16 : compute == DType::f16 ? flops_fp16 : flops_fp32;
}

double Hardware::attention_flops_for(bool flash, DType compute) const {
  const double measured = flash ? flash_attention_flops_per_s : attention_flops_per_s;
  return measured > 0 ? measured : flops_for(compute);
}

nlohmann::json Hardware::to_json() const {
  auto l = [](const LinkSpec& s) { return nlohmann::json{{"bytes_per_s", s.bytes_per_s}, {"latency_s", s.latency_s}}; };
  nlohmann::json j = {{"name", name},
          {"source", source},
          {"flops", {{"fp32", flops_fp32}, {"bf16", flops_bf16}, {"fp16", flops_fp16}}},
          {"memory", {{"bytes", memory_bytes}, {"bytes_per_s", memory_bytes_per_s}}},
          {"chips_per_node", chips_per_node},
          {"links", {{"intra", l(intra)}, {"inter", l(inter)}}},
          {"dp_overlap", dp_overlap},
          {"device", device_name(device)}};
  nlohmann::json rates = nlohmann::json::object();
  for (const auto& [key, v] : op_rates(*this))
    if (*v > 0) rates[key] = *v;
  if (!rates.empty()) j["ops"] = rates;
  return j;
}

std::vector<std::string> hardware_names() { return {"h100", "h200", "a100", "cpu"}; }

Hardware hardware_from_json(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) fail("hardware file '%s' must hold a JSON object", origin.c_str());
  Hardware h;
  const nlohmann::json& name = field(j, "", "name", origin);
  if (!name.is_string() || name.get<std::string>().empty())
    fail("hardware file '%s': field 'name' must be a non-empty string", origin.c_str());
  h.name = name.get<std::string>();
  if (j.contains("source")) {
    if (!j["source"].is_string()) fail("hardware file '%s': field 'source' must be a string", origin.c_str());
    h.source = j["source"].get<std::string>();
  }
  const nlohmann::json& f = field(j, "", "flops", origin);
  h.flops_fp32 = number(f, "flops.", "fp32", origin);
  h.flops_bf16 = number(f, "flops.", "bf16", origin);
  h.flops_fp16 = number(f, "flops.", "fp16", origin);
  const nlohmann::json& m = field(j, "", "memory", origin);
  h.memory_bytes = number(m, "memory.", "bytes", origin);
  h.memory_bytes_per_s = number(m, "memory.", "bytes_per_s", origin);
  const double per_node = number(j, "", "chips_per_node", origin);
  if (per_node > double(config::kMaxRanks))
    fail("hardware file '%s': field 'chips_per_node' must be at most %lld (got %g)", origin.c_str(),
         (long long)config::kMaxRanks, per_node);
  if (per_node != double(int(per_node)))
    fail("hardware file '%s': field 'chips_per_node' must be an integer (got %g)", origin.c_str(), per_node);
  h.chips_per_node = int(per_node);
  field(j, "", "links", origin);
  h.intra = link(j["links"], "intra", origin);
  h.inter = link(j["links"], "inter", origin);
  if (j.contains("dp_overlap")) {
    h.dp_overlap = number(j, "", "dp_overlap", origin, false);
    if (h.dp_overlap > 1) fail("hardware file '%s': field 'dp_overlap' must be in [0, 1] (got %g)", origin.c_str(), h.dp_overlap);
  }
  if (j.contains("device")) {
    const nlohmann::json& d = j["device"];
    if (!d.is_string() || (d != "cpu" && d != "cuda"))
      fail("hardware file '%s': field 'device' must be \"cpu\" or \"cuda\" (got %s)", origin.c_str(), d.dump().c_str());
    h.device = d == "cpu" ? Device::cpu : Device::cuda;
  }
  if (j.contains("ops")) {
    const nlohmann::json& ops = j["ops"];
    if (!ops.is_object()) fail("hardware file '%s': field 'ops' must be an object of rates", origin.c_str());
    for (const auto& [key, v] : op_rates(h))
      if (ops.contains(key)) *v = number(ops, "ops.", key, origin);
    for (const auto& [key, v] : ops.items()) {
      bool known = false;
      for (const auto& r : op_rates(h)) known = known || key == r.first;
      if (!known) fail("hardware file '%s': unknown field 'ops.%s'", origin.c_str(), key.c_str());
    }
  }
  return h;
}

Hardware load_hardware_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("hw=%s: not a known hardware name (h100, h200, a100, cpu) and no such file", path.c_str());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    fail("hardware file '%s' is not valid JSON: %s", path.c_str(), what.c_str());
  }
  return hardware_from_json(j, path);
}

Hardware resolve_hardware(const std::string& spec) {
  if (spec == "h100") return h100();
  if (spec == "h200") return h200();
  if (spec == "a100") return a100();
  if (spec == "cpu") return cpu();
  return load_hardware_file(spec);
}

Peak gpu_peak_from_name(const std::string& name) {
  for (const Datasheet& d : kDatasheets)
    if (name.find(d.key) != std::string::npos)
      return {d.flops_bf16, strfmt("%s bf16 dense peak (datasheet)", d.key), d.memory_bytes_per_s};
  return {0, "unknown GPU"};
}

}  // namespace mt::plan
