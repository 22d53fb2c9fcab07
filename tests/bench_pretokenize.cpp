// Pre-tokenizer throughput: pretokenize() over each input file as one text, best of --reps runs,
// printed as a table of MB/s (10^6 bytes per second) by wall time and by the thread's CPU time (on
// a shared machine the second is the steadier). A benchmark program, not a test.
// Usage: bench_pretokenize [--reps N] FILE...
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/pretokenize.h"

int main(int argc, char** argv) {
  int reps = 5;
  std::vector<std::string> files;
  for (int i = 1; i < argc; i++) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else
      files.push_back(argv[i]);
  }
  if (files.empty() || reps < 1) {
    std::fprintf(stderr, "usage: bench_pretokenize [--reps N] FILE...\n");
    return 2;
  }
  std::printf("| file | MB | pieces | bytes/piece | MB/s wall (best of %d) | MB/s CPU (best of %d) |\n"
              "|---|---|---|---|---|---|\n",
              reps, reps);
  auto cpu_seconds = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s: cannot read\n", f.c_str());
      return 1;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    std::vector<std::string_view> pieces;
    double best_wall = 1e30, best_cpu = 1e30;
    for (int r = 0; r < reps; r++) {
      pieces.clear();
      auto t0 = std::chrono::steady_clock::now();
      double c0 = cpu_seconds();
      mt::data::pretokenize(text, pieces);
      best_cpu = std::min(best_cpu, cpu_seconds() - c0);
      best_wall = std::min(best_wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double mb = double(text.size()) / 1e6;
    std::printf("| %s | %.2f | %zu | %.2f | %.1f | %.1f |\n", f.c_str(), mb, pieces.size(),
                double(text.size()) / double(pieces.size()), mb / best_wall, mb / best_cpu);
  }
  return 0;
}
