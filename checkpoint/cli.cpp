#include "checkpoint/cli.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/catalog.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/fsio.h"
#include "checkpoint/reader.h"
#include "parallel/self_comm.h"
#include "runtime/arena.h"
#include "runtime/check.h"

namespace mt::checkpoint {

namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: minitrain ckpt ls <dir>\n"
    "       minitrain ckpt verify <checkpoint, root or root/latest>...\n"
    "       minitrain ckpt export <checkpoint, root or root/latest> <out.safetensors> [--all]\n"
    "       minitrain ckpt bench --dir D [--mb N] [--saves K] [--interval S]\n";

std::string utc_time(double unix_s) {
  const std::time_t t = std::time_t(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string base_name(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/"
  return p.filename().string();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int cmd_ls(const std::string& root) {
  if (!io::is_dir(root)) fail("ckpt ls: %s is not a directory", root.c_str());
  const std::optional<std::string> latest = read_latest(root);
  std::printf("%-22s %8s %6s %12s %20s  %s\n", "checkpoint", "step", "ranks", "size", "committed (UTC)", "status");
  int shown = 0;
  for (const std::string& name : io::list_dir(root)) {
    const std::string path = io::join(root, name);
    if (ends_with(name, ".tmp") && io::is_dir(path)) {
      std::printf("%-22s %8s %6s %12s %20s  %s\n", name.c_str(), "-", "-", "-", "-",
                  "unfinished save (deleted when training restarts)");
      shown++;
      continue;
    }
    if (!parse_step_dir_name(name) || !io::is_dir(path)) continue;
    shown++;
    // Every checkpoint listed is verified (every byte read and checked), so "ok" means usable.
    try {
      const Reader r(path);
      uint64_t bytes = 0;
      for (const FileRecord& f : r.manifest().files) bytes += f.bytes;
      std::string status = "ok, verified";
      try {
        r.verify_all();
      } catch (const Error& e) {
        status = std::string("DAMAGED: ") + e.what();
      }
      std::printf("%-22s %8lld %6zu %12s %20s  %s%s\n", name.c_str(), (long long)r.step(), r.manifest().files.size(),
                  format_bytes(size_t(bytes)).c_str(), utc_time(r.manifest().created_unix).c_str(), status.c_str(),
                  latest && *latest == name ? " (latest)" : "");
    } catch (const Error& e) {
      std::printf("%-22s %8s %6s %12s %20s  DAMAGED: %s\n", name.c_str(), "-", "-", "-", "-", e.what());
    }
  }
  if (shown == 0) std::printf("(no checkpoints in %s)\n", root.c_str());
  return 0;
}

int cmd_verify(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::vector<std::string> targets;
  for (const std::string& a : args) {
    if (io::is_dir(a) && !io::exists(io::join(a, kManifestName)) && !parse_step_dir_name(base_name(a))) {
      // A root: every checkpoint under it.
      const std::vector<CatalogEntry> all = list_checkpoints(a);
      if (all.empty()) {
        std::printf("FAILED %s: not a checkpoint, and holds no step_* checkpoints\n", a.c_str());
        targets.push_back("");
      }
      for (auto it = all.rbegin(); it != all.rend(); ++it) targets.push_back(it->path);
    } else if (base_name(a) == kLatestName && !io::is_dir(a)) {
      // ROOT/latest: the checkpoint it names.
      try {
        targets.push_back(resolve_checkpoint(a));
      } catch (const Error& e) {
        std::printf("FAILED %s: %s\n", a.c_str(), e.what());
        targets.push_back("");
      }
    } else {
      targets.push_back(a);
    }
  }
  int failed = 0;
  for (const std::string& t : targets) {
    if (t.empty()) {
      failed++;
      continue;
    }
    try {
      const Reader r(t);
      r.verify_all();
      uint64_t bytes = 0;
      for (const FileRecord& f : r.manifest().files) bytes += f.bytes;
      std::printf("ok %s: step %lld, %zu rank files, %zu tensors, %s, all checksums match\n", t.c_str(),
                  (long long)r.step(), r.manifest().files.size(), r.tensors().size(), format_bytes(size_t(bytes)).c_str());
    } catch (const Error& e) {
      std::printf("FAILED %s: %s\n", t.c_str(), e.what());
      failed++;
    }
  }
  return failed ? 1 : 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Stands in for a training run's state: `mb` MB of fp32 in 3 x 12 tensors (params, two moments).
int cmd_bench(const std::vector<std::string>& args) {
  std::string dir;
  double mb = 512, interval = 2;
  int saves = 3;
  for (size_t i = 0; i < args.size(); i++) {
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) fail("ckpt bench: %s needs a value", args[i].c_str());
      return args[++i];
    };
    if (args[i] == "--dir") dir = value();
    else if (args[i] == "--mb") mb = std::atof(value().c_str());
    else if (args[i] == "--saves") saves = std::atoi(value().c_str());
    else if (args[i] == "--interval") interval = std::atof(value().c_str());
    else fail("ckpt bench: unknown flag %s\n%s", args[i].c_str(), kUsage);
  }
  if (dir.empty()) fail("ckpt bench: --dir is required (a directory on the disk to measure; it is deleted after)");
  if (mb <= 0 || saves < 2 || interval < 0) fail("ckpt bench: need --mb > 0, --saves >= 2, --interval >= 0");
  const int64_t per_tensor = std::max<int64_t>(1, int64_t(mb * 1e6 / 4 / 36));
  std::vector<std::vector<float>> data(36, std::vector<float>(size_t(per_tensor)));
  SaveRequest req;
  for (int g = 0; g < 3; g++)
    for (int t = 0; t < 12; t++) {
      const std::string name = std::string(g == 0 ? "param/" : g == 1 ? "adam_m/" : "adam_v/") + "t" + std::to_string(t);
      std::vector<float>& v = data[size_t(g * 12 + t)];
      for (size_t k = 0; k < v.size(); k++) v[k] = float(k % 1000) * 1e-3f + float(g);
      req.tensors.push_back({name, {per_tensor}, DType::f32});
      req.pieces.push_back({name, 0, per_tensor, v.data()});
    }
  const double total_mb = double(per_tensor) * 36 * 4 / 1e6;
  parallel::SelfComm self;
  // "Training" between saves: forward and backward (a pause), then the optimizer changes the weights
  // while the save may still be in flight (after the fence, for a deferred snapshot).
  auto train_for = [&](Checkpointer& ck, double seconds) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    ck.snapshot_fence();
    for (auto& v : data) v[0] += 1.f;
  };
  struct Row { std::string mode; int save; Checkpointer::SaveStats s; };
  std::vector<Row> rows;
  for (const std::string mode : {"sync", "async", "deferred"}) {
    Options o;
    o.dir = dir;
    o.keep = 1;
    o.async = mode != "sync";
    o.deferred_snapshot = mode == "deferred";
    o.log = Logger(LogLevel::warn);
    Checkpointer ck(o, self);
    for (int k = 0; k < saves; k++) {
      req.step = int64_t(rows.size());
      ck.save(req);
      train_for(ck, o.async ? interval : 0.1);
      ck.wait();
      rows.push_back({mode, k, *ck.last_completed()});
    }
  }
  io::remove_tree(dir);
  std::printf("checkpoint save of %.0f MB (36 fp32 tensors), one rank, %s\n\n", total_mb, dir.c_str());
  std::printf("| mode     | save | blocking s | of which stall s | background s | write MB/s |\n");
  std::printf("|----------|------|------------|------------------|--------------|------------|\n");
  std::map<std::string, std::vector<double>> blocking;  // per mode, saves 1.. (save 0 pays first touch)
  for (const Row& r : rows) {
    const double write_s = r.mode == "sync" ? r.s.blocking_s : r.s.background_s;
    std::printf("| %-8s | %4d | %10.3f | %16.3f | %12.3f | %10.0f |\n", r.mode.c_str(), r.save, r.s.blocking_s,
                r.s.stall_s, r.s.background_s, total_mb / write_s);
    if (r.save > 0) blocking[r.mode].push_back(r.s.blocking_s - r.s.stall_s);
  }
  const double sync_s = median(blocking["sync"]);
  std::printf("\nmedians over saves 1..%d (save 0 allocates and first-touches the staging buffer):\n", saves - 1);
  std::printf("  synchronous save                        %.3f s\n", sync_s);
  std::printf("  async, copy at save() (blocking part)   %.3f s = %.1f%% of a synchronous save (bar: <= 10%%)\n",
              median(blocking["async"]), 100 * median(blocking["async"]) / sync_s);
  std::printf("  async, deferred snapshot (save + fence) %.3f s = %.1f%%, with %.1f s of training before the fence\n",
              median(blocking["deferred"]), 100 * median(blocking["deferred"]) / sync_s, interval);
  return 0;
}

}  // namespace

std::string resolve_checkpoint(const std::string& path) {
  if (base_name(path) == kLatestName && !io::is_dir(path)) {
    const std::string root = fs::path(path).lexically_normal().parent_path().string();
    const std::optional<std::string> name = read_latest(root.empty() ? "." : root);
    if (!name) fail("%s does not name a checkpoint (expected a step_* name)", path.c_str());
    return io::join(root.empty() ? "." : root, *name);
  }
  if (!io::is_dir(path) || io::exists(io::join(path, kManifestName)) || parse_step_dir_name(base_name(path)))
    return path;  // a checkpoint, or not one: the reader says which
  parallel::SelfComm self;
  const std::optional<Found> found = find_latest_valid(path, self, Logger(LogLevel::warn));
  if (!found) fail("%s holds no checkpoint", path.c_str());
  return found->path;
}

int ckpt_cli(int argc, char** argv) {
  if (argc < 1) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = argv[0];
  const std::vector<std::string> args(argv + 1, argv + argc);
  // -h or --help anywhere (`ckpt ls --help` too): the usage, not a path named "--help".
  for (int i = 0; i < argc; i++)
    if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  try {
    if (cmd == "ls") {
      if (args.size() != 1) {
        std::fputs(kUsage, stderr);
        return 2;
      }
      return cmd_ls(args[0]);
    }
    if (cmd == "verify") return cmd_verify(args);
    if (cmd == "bench") return cmd_bench(args);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "ckpt: unknown subcommand '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}

}  // namespace mt::checkpoint
