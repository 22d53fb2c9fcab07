// Pre-tokenizer throughput: pretokenize() over each input file as one text, best of --reps runs,
// printed as a table of MB/s (10^6 bytes per second). A benchmark program, not a test.
// Usage: bench_pretokenize [--reps N] FILE...
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
  std::printf("| file | MB | pieces | bytes/piece | MB/s (best of %d) |\n|---|---|---|---|---|\n", reps);
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
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
      pieces.clear();
      auto t0 = std::chrono::steady_clock::now();
      mt::data::pretokenize(text, pieces);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s < best) best = s;
    }
    std::printf("| %s | %.2f | %zu | %.2f | %.1f |\n", f.c_str(), text.size() / 1e6, pieces.size(),
                double(text.size()) / double(pieces.size()), text.size() / 1e6 / best);
  }
  return 0;
}
