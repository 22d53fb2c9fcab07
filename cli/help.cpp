#include "cli/help.h"

#include <algorithm>
#include <map>

#include "cli/bench.h"
#include "cli/version.h"
#include "config/options.h"
#include "runtime/check.h"

namespace mt::cli {

namespace {

// Keys that are other spellings of a key of to_json(): their default is that key's.
const std::map<std::string, std::string>& default_aliases() {
  static const std::map<std::string, std::string> m = {{"model", "model.preset"}, {"tp.sp", "parallel.sp"}, {"trace", "trace.on"}};
  return m;
}

void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, nlohmann::json>& out) {
  for (auto& [k, v] : j.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object()) flatten(v, key, out);
    else out[key] = v;
  }
}

std::string type_of(const nlohmann::json& v) {
  if (v.is_boolean()) return "bool";
  if (v.is_number_integer()) return "int";
  if (v.is_number()) return "number";
  return "string";
}

std::string show(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>().empty() ? "''" : v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_float()) return strfmt("%g", v.get<double>());
  return v.dump();
}

}  // namespace

const std::vector<std::string>& help_groups() {
  static const std::vector<std::string> g = {"model",      "data",    "batch", "optimizer", "precision", "parallel", "moe",
                                             "checkpoint", "logging", "run",   "testing"};
  return g;
}

std::vector<HelpRow> help_rows() {
  std::map<std::string, nlohmann::json> defaults;
  flatten(config::TrainOptions{}.to_json(), "", defaults);
  std::vector<HelpRow> rows;
  for (const config::OptionDoc& d : config::option_docs()) {
    auto alias = default_aliases().find(d.key);
    auto it = defaults.find(alias == default_aliases().end() ? d.key : alias->second);
    MT_CHECK(it != defaults.end(), "option '%s' has no default in TrainOptions::to_json()", d.key.c_str());
    rows.push_back({d.key, d.group, type_of(it->second), show(it->second), d.meaning});
  }
  return rows;
}

std::string train_help(const std::string& command) {
  std::string s;
  if (command == "bench")
    s = strfmt("usage: minitrain bench [--config run.json] [key=value ...] [--key value ...] [warmup=N]\n"
               "Times training steps (synthetic tokens unless data.path is given; %d measured steps unless steps is\n"
               "given, after warmup=N unmeasured ones, default %d) and prints tokens/s, MFU/HFU, the time split and\n"
               "memory. `minitrain bench --calibrate [out=FILE] [threads=N]` instead measures this machine (GEMM rate,\n"
               "memory bandwidth, MPI latency and bandwidth by message size under mpirun) and writes a hardware file\n"
               "for `minitrain plan hw=FILE`. It takes every option of `minitrain train`:\n", kBenchSteps, kBenchWarmup);
  else
    s = "usage: minitrain train [--config run.json] [key=value ...] [--key value ...]\n"
        "Trains a GPT and writes metrics.jsonl, config.json, checkpoints/ and model.safetensors to out_dir.\n";
  s += "Options are key=value or --key value (--out for out_dir, --data for data.path); the parallel.*\n"
       "options also without their prefix (dp=2, --tp 2); in --config as nested JSON keys.\n";
  const std::vector<HelpRow> rows = help_rows();
  size_t wk = 0, wt = 0, wd = 0;
  for (const HelpRow& r : rows) {
    wk = std::max(wk, r.key.size());
    wt = std::max(wt, r.type.size());
    wd = std::max(wd, std::min<size_t>(r.default_value.size(), 12));
  }
  for (const std::string& g : help_groups()) {
    s += "\n" + g + ":\n";
    for (const HelpRow& r : rows)
      if (r.group == g)
        s += strfmt("  %-*s  %-*s  %-*s  %s\n", int(wk), r.key.c_str(), int(wt), r.type.c_str(), int(wd),
                    r.default_value.c_str(), r.meaning.c_str());
  }
  return s;
}

bool wants_help(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "-h" || a == "--help"; });
}

std::string version_text() {
  return strfmt("minitrain %s (git %s)\n"
                "build: %s, compiler %s\n"
                "  CUDA %s%s, NCCL %s, MPI %s, BLAS %s\n",
                kVersion, kGitRevision, kBuildType, kCompiler,
                kCudaSimulated ? "simulated" : kHaveCuda ? "on" : "off",
                kCudaSimulated ? " (the CUDA backend on a simulated device, on the CPU: no GPU)"
                : kHaveCuda    ? strfmt(" (architectures %s)", kCudaArchs).c_str()
                               : "", kHaveNccl ? "on" : "off",
                kHaveMpi ? "on" : "off", kHaveBlas ? "on (OpenBLAS)" : "off (built-in GEMM)");
}

}  // namespace mt::cli
