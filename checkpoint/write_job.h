// One save's background work, split from checkpointer.cpp so the commit protocol reads on its own.
// Internal to checkpoint/ (the public interface is checkpointer.h).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpointer.h"
#include "checkpoint/format.h"
#include "runtime/check.h"

namespace mt::checkpoint {

// A run of the rank file's bytes in file order: the header, one per piece, the metadata.
struct Segment {
  const char* data = nullptr;
  size_t bytes = 0;
  int piece = -1;  // index into WriteJob::file.pieces, or -1 for the header and metadata
};

// One copy into the staging buffer.
struct CopyTask {
  char* dst;
  const char* src;
  size_t bytes;
};

struct WriteJob {
  int rank = 0, world_size = 1;
  int64_t step = 0;
  std::string root, tmp_dir, final_dir, save_id;
  FileRecord file;                 // offsets and lengths set when staged; checksums when written
  std::vector<Segment> segments;   // point into the staging buffer, or into the caller's memory (sync)
  std::string header, meta_text;   // bytes owned by the job (segments may point here)
  std::vector<TensorInfo> tensors;  // rank 0: for the manifest
  nlohmann::json global_meta;       // rank 0: for the manifest
  Checkpointer::SaveStats stats;
  bool published = false;  // this rank's table is out: rank 0 may be using its file
  const std::atomic<bool>* cancel = nullptr;  // set: stop waiting for other ranks (the owner is unwinding)
  // The staging copies, done in save() or, with a deferred snapshot, first thing in the background;
  // `staged` (under `mu`, signalled on `staged_cv`) says they are done and the sources are free.
  std::vector<CopyTask> copies;
  std::mutex mu;
  std::condition_variable staged_cv;
  bool staged = false;
  double copy_helper_cpu_s = 0;  // CPU time of the staging copy's helper threads
};

// What a wait of the background job throws once its owner cancelled it (WriteJob::cancel: the
// Checkpointer is destroyed while an exception unwinds, so the process is failing and reports its own
// error). Not a failure of the save: no one reports it.
class SaveCancelled : public Error {
 public:
  using Error::Error;
};

// Whether rank 0 committed the job's save (step_N/ carries this save's id).
bool committed(const WriteJob& job);

// The steps of run(): see the protocol in checkpointer.h. Each throws mt::Error naming the path.
void write_rank_file(WriteJob& job, const Options& o);
void publish_table(WriteJob& job);
void commit(WriteJob& job, const Options& o);       // rank 0
void await_commit(WriteJob& job, const Options& o);  // the other ranks
// After a failure: rank 0 removes step_N.tmp/; another rank that had not yet published its table
// removes its own file and leaves a rank_R.failed note with `why` for rank 0 (once published, the
// file is rank 0's to judge). Best effort, never throws.
void abandon(WriteJob& job, const std::string& why) noexcept;

}  // namespace mt::checkpoint
