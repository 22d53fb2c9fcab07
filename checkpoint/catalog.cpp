#include "checkpoint/catalog.h"

#include <algorithm>

#include "checkpoint/format.h"
#include "checkpoint/fsio.h"
#include "checkpoint/reader.h"
#include "runtime/check.h"

namespace mt::checkpoint {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<CatalogEntry> list_checkpoints(const std::string& root) {
  std::vector<CatalogEntry> out;
  if (!io::is_dir(root)) return out;
  for (const std::string& name : io::list_dir(root)) {
    const std::optional<int64_t> step = parse_step_dir_name(name);
    const std::string path = io::join(root, name);
    if (!step || !io::is_dir(path)) continue;
    CatalogEntry e{name, path, *step, 0, ""};
    try {
      e.created_unix = read_manifest(path).created_unix;
    } catch (const Error& err) {
      e.problem = err.what();
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const CatalogEntry& a, const CatalogEntry& b) {
    const bool ra = a.problem.empty(), rb = b.problem.empty();
    if (ra != rb) return ra;
    if (a.created_unix != b.created_unix) return a.created_unix > b.created_unix;
    return a.step > b.step;
  });
  return out;
}

void clean_stale(const std::string& root, const Logger& log) {
  if (!io::is_dir(root)) return;
  for (const std::string& name : io::list_dir(root)) {
    if (!ends_with(name, ".tmp")) continue;
    const std::string path = io::join(root, name);
    const std::string err = io::remove_tree(path);
    if (!err.empty()) fail("cleaning stale checkpoint entries: %s", err.c_str());
    MT_LOG_INFO(log, "checkpoint: removed %s (left by an unfinished save)", path.c_str());
  }
}

void apply_retention(const std::string& root, int keep, const Logger& log) {
  if (keep <= 0) return;
  const std::vector<CatalogEntry> all = list_checkpoints(root);
  int kept = 0;
  for (const CatalogEntry& e : all) {
    if (!e.problem.empty()) continue;  // not ours to judge: left for a person (or `ckpt verify`) to look at
    if (kept < keep) {
      kept++;
      continue;
    }
    // Only a checkpoint that verifies is deleted: a damaged one (whose weights may well be intact)
    // is left for a person to look at.
    try {
      verify(e.path);
    } catch (const Error& err) {
      MT_LOG_WARN(log, "checkpoint retention: keeping %s, which does not verify (%s)", e.path.c_str(), err.what());
      continue;
    }
    const std::string doomed = e.path + ".old.tmp";
    try {
      io::rename_path(e.path, doomed);
    } catch (const Error& err) {
      MT_LOG_WARN(log, "checkpoint retention: %s", err.what());
      continue;
    }
    const std::string err = io::remove_tree(doomed);
    if (!err.empty()) MT_LOG_WARN(log, "checkpoint retention: %s", err.c_str());
  }
}

std::optional<std::string> read_latest(const std::string& root) {
  const std::string path = io::join(root, kLatestName);
  if (!io::exists(path)) return std::nullopt;
  std::string s;
  try {
    s = io::read_file(path);
  } catch (const Error&) {
    return std::nullopt;
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  if (!parse_step_dir_name(s)) return std::nullopt;
  return s;
}

void write_latest(const std::string& root, const std::string& name) {
  io::write_file_atomically(io::join(root, kLatestName), name + "\n");
}

}  // namespace mt::checkpoint
