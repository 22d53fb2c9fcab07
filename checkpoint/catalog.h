// The checkpoint root as a whole: which checkpoints it holds, the `latest` pointer, stale temporary
// entries, retention.
//
// "Newest" means most recently committed: checkpoints are ordered by the commit time recorded in
// their manifest, then by step. That equals step order in a normal run, and stays right after a run
// was resumed from an older checkpoint (the abandoned run's higher-step checkpoints are older
// commits, so they are neither resumed from nor kept in place of the new run's).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/log.h"

namespace mt::checkpoint {

struct CatalogEntry {
  std::string name;  // "step_000120"
  std::string path;  // <root>/step_000120
  int64_t step = 0;
  double created_unix = 0;  // from the manifest; 0 when it cannot be read
  std::string problem;      // why the manifest cannot be read ("" when it can)
};

// The committed step_* directories of `root` (not *.tmp), newest first (see above; entries whose
// manifest cannot be read come last). An absent root is empty.
std::vector<CatalogEntry> list_checkpoints(const std::string& root);

// Deletes every *.tmp entry of `root`: the leftovers of saves that were killed or failed.
void clean_stale(const std::string& root, const Logger& log);

// Keeps the newest `keep` readable checkpoints and deletes the older ones that verify (keep <= 0:
// keep all); a damaged one is never deleted, only logged. A directory is renamed to *.tmp before it
// is deleted, so a crash midway leaves no half checkpoint.
void apply_retention(const std::string& root, int keep, const Logger& log);

// The directory name stored in <root>/latest, or nullopt when there is none (or it is not a step_* name).
std::optional<std::string> read_latest(const std::string& root);
// Replaces <root>/latest atomically (write latest.tmp, fsync, rename, fsync root).
void write_latest(const std::string& root, const std::string& name);

}  // namespace mt::checkpoint
