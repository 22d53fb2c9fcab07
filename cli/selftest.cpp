// The `minitrain selftest` command: argument parsing, the device probe and the result table. The checks
// themselves are in selftest_checks.cpp.
#include "cli/selftest.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>

#include "kernels/cuda_available.h"
#include "runtime/check.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mt::cli {

namespace {

const char* kSelftestUsage =
    "usage: minitrain selftest [--device cuda] [--seed S] [--op name,name] [--list] [--perturb]\n"
    "  runs every CUDA op against its CPU twin on fresh random inputs and prints a table;\n"
    "  exit status 0: all passed, 1: a check failed, 3: no CUDA device or no CUDA backend.\n"
    "  --perturb corrupts one element of every device result, so every check must FAIL.\n";

uint64_t parse_seed(const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long s = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || *end || errno || v[0] == '-') fail("--seed must be a non-negative integer (got '%s')", v.c_str());
  return uint64_t(s);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// The first line of a message, shortened, so a table row stays one line.
std::string one_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  if (line.size() > 160) line = line.substr(0, 157) + "...";
  return line;
}

std::string format_error(const OpCheckResult& r) {
  if (r.measure == "count") return std::isfinite(r.error) ? strfmt("%.0f", r.error) : "-";
  return std::isfinite(r.error) ? strfmt("%.2e", r.error) : "inf/nan";
}

}  // namespace

void print_selftest_header(FILE* out) {
  std::fprintf(out, "error: max |cuda - cpu| / max |cpu| over the output; whole numbers are mismatch counts\n");
  std::fprintf(out, "| %-22s | %-16s | %-34s | %-9s | %-11s | %-9s | %-6s |\n", "op", "output", "shape", "dtype",
               "max rel err", "tolerance", "result");
  std::fprintf(out, "|------------------------|------------------|------------------------------------|-----------|"
                    "-------------|-----------|--------|\n");
}

void print_selftest_row(FILE* out, const OpCheckResult& r) {
  const std::string tol = r.measure == "count" ? strfmt("%.0f", r.tolerance) : strfmt("%.0e", r.tolerance);
  std::fprintf(out, "| %-22s | %-16s | %-34s | %-9s | %-11s | %-9s | %-6s |", r.op.c_str(), r.output.c_str(),
               r.shape.c_str(), r.dtype.c_str(), format_error(r).c_str(), tol.c_str(), r.pass ? "PASS" : "FAIL");
  if (!r.message.empty()) std::fprintf(out, " %s", one_line(r.message).c_str());
  std::fprintf(out, "\n");
  std::fflush(out);
}

void print_selftest_summary(FILE* out, const std::vector<OpCheckResult>& results) {
  size_t passed = 0;
  double max_rel = 0, worst_ratio = -1;
  const OpCheckResult* worst = nullptr;
  for (const OpCheckResult& r : results) {
    passed += r.pass;
    if (r.measure == "rel") max_rel = std::isfinite(r.error) ? std::max(max_rel, r.error) : INFINITY;
    // The worst result relative to its tolerance; a failed exact check (tolerance 0) is infinitely bad.
    const double ratio = r.tolerance > 0 ? r.error / r.tolerance : r.error > 0 ? INFINITY : 0;
    if (!worst || ratio > worst_ratio) worst = &r, worst_ratio = ratio;
  }
  std::fprintf(out, "selftest summary: passed=%zu failed=%zu max_rel_err=%.2e", passed, results.size() - passed,
               max_rel);
  if (worst)
    std::fprintf(out, " worst=%s/%s@%s err/tol=%.3g", worst->op.c_str(), worst->output.c_str(), worst->shape.c_str(),
                 worst_ratio);
  std::fprintf(out, "\n");
  std::fflush(out);
}

int selftest_main(const std::vector<std::string>& args) {
  uint64_t seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  std::vector<std::string> only;
  bool list = false, perturb = false;
  const std::vector<std::string> names = selftest_check_names();
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kSelftestUsage, stdout);
      return 0;
    }
    if (a == "--list") {
      list = true;
      continue;
    }
    if (a == "--perturb") {
      perturb = true;
      continue;
    }
    if (a != "--device" && a != "--seed" && a != "--op") fail("unknown selftest flag '%s'\n%s", a.c_str(), kSelftestUsage);
    if (i + 1 >= args.size()) fail("flag %s needs a value", a.c_str());
    const std::string& v = args[++i];
    if (a == "--device") {
      if (v != "cuda")
        fail("--device %s: selftest checks the CUDA backend against the CPU reference; use --device cuda", v.c_str());
    } else if (a == "--seed") {
      seed = parse_seed(v);
    } else {
      for (const std::string& op : split_commas(v)) {
        bool known = false;
        for (const std::string& n : names) known |= n == op;
        if (!known) fail("--op: unknown op check '%s' (see `minitrain selftest --list`)", op.c_str());
        only.push_back(op);
      }
    }
  }
  if (list) {
    for (const std::string& n : names) std::printf("%s\n", n.c_str());
    return 0;
  }

  std::string why;
  try {
    why = ops::cuda_unavailable_reason();
    if (!why.empty()) why = "selftest: " + why;
  } catch (const std::exception& e) {  // a driver that is present but broken
    why = "selftest: the CUDA driver failed: " + one_line(e.what());
  }
  if (!why.empty()) {
    std::fprintf(stderr, "%s\n", why.c_str());
    return 3;
  }

  std::printf("selftest: CUDA backend vs CPU reference, seed %llu (rerun: minitrain selftest --seed %llu)%s\n",
              (unsigned long long)seed, (unsigned long long)seed, perturb ? ", device results PERTURBED" : "");
  print_selftest_header(stdout);
  std::vector<OpCheckResult> all;
  const auto t0 = std::chrono::steady_clock::now();
  for (const std::string& name : only.empty() ? names : only) {
    for (const OpCheckResult& r : run_op_check(name, seed, perturb)) {
      print_selftest_row(stdout, r);
      all.push_back(r);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("selftest: %zu comparisons in %.1f s\n", all.size(), secs);
  print_selftest_summary(stdout, all);
  for (const OpCheckResult& r : all)
    if (!r.pass) return 1;
  return 0;
}

}  // namespace mt::cli
