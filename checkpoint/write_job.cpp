// The background half of a save: write and publish this rank's file; on rank 0 gather the other
// ranks' tables and commit; on the others wait for that commit. No MPI here (see checkpointer.h).
#include "checkpoint/write_job.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

#include "checkpoint/catalog.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/fsio.h"
#include "checkpoint/reader.h"
#include "runtime/check.h"

namespace mt::checkpoint {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

bool fault_is(const Options& o, const WriteJob& job, const char* phase) {
  return o.fault_phase == phase && o.fault_step == job.step &&
         (o.fault_rank == job.rank || o.fault_rank == Options::kEveryRank);
}

// Polls `ready` with a growing pause (1 ms .. 50 ms) until it returns true or `timeout_s` passes;
// throws SaveCancelled at once when the job is cancelled.
template <class F>
bool poll_until(const WriteJob& job, double timeout_s, F ready) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    if (ready()) return true;
    if (job.cancel && job.cancel->load())
      throw SaveCancelled("cancelled while waiting for the other ranks (the process is failing)");
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

std::string save_id_of(const std::string& ckpt_dir) {
  try {
    return json::parse(io::read_file(io::join(ckpt_dir, kManifestName))).value("save_id", "");
  } catch (const std::exception&) {
    return "";
  }
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

bool committed(const WriteJob& job) { return save_id_of(job.final_dir) == job.save_id; }

void write_rank_file(WriteJob& job, const Options& o) {
  const std::string path = io::join(job.tmp_dir, rank_file_name(job.rank));
  io::OutFile f(path);
  if (fault_is(o, job, "enospc")) f.inject_error(ENOSPC);
  const uint64_t half = job.file.bytes / 2;
  bool stalled = false;
  auto halfway = [&] {
    fault_point(o, job.rank, job.step, "write");
    if (!stalled && fault_is(o, job, "slow_write")) {
      stalled = true;
      std::this_thread::sleep_for(std::chrono::duration<double>(Options::kSlowWriteStallS));
    }
  };
  for (const Segment& s : job.segments) {
    if (s.piece < 0) {
      f.write(s.data, s.bytes);
    } else {
      // Checksum each chunk just before writing it, while it is still in cache.
      PieceRecord& p = job.file.pieces[size_t(s.piece)];
      p.crc.clear();
      for (size_t at = 0; at < s.bytes; at += kChunkBytes) {
        const size_t n = std::min<size_t>(kChunkBytes, s.bytes - at);
        p.crc.push_back(crc32c(s.data + at, n));
        f.write(s.data + at, n);
        if (f.written() >= half) halfway();
      }
    }
    if (f.written() >= half) halfway();
  }
  MT_CHECK(f.written() == job.file.bytes, "%s: wrote %llu bytes, the layout says %llu", path.c_str(),
           (unsigned long long)f.written(), (unsigned long long)job.file.bytes);
  job.file.header_crc = crc32c(job.header.data(), job.header.size());
  job.file.meta.crc = crc32c(job.meta_text.data(), job.meta_text.size());
  f.sync();
  f.close();
  io::fsync_dir(job.tmp_dir);
}

void publish_table(WriteJob& job) {
  io::write_file_atomically(io::join(job.tmp_dir, rank_table_name(job.rank)), file_to_json(job.file).dump());
  job.published = true;
}

void commit(WriteJob& job, const Options& o) {
  // 1. Every other rank's table (its "my file is durable" marker), or the note of its failure.
  std::vector<FileRecord> files(size_t(job.world_size));
  files[0] = job.file;
  std::vector<bool> have(size_t(job.world_size), false);
  have[0] = true;
  const bool all = poll_until(job, o.commit_timeout_s, [&] {
    for (int r = 1; r < job.world_size; r++) {
      if (have[size_t(r)]) continue;
      const std::string failed = io::join(job.tmp_dir, rank_failed_name(r));
      if (io::exists(failed)) throw parallel::FollowOnError(strfmt("rank %d failed: %s", r, io::read_file(failed).c_str()));
      const std::string table = io::join(job.tmp_dir, rank_table_name(r));
      if (!io::exists(table)) continue;
      json j;
      try {
        j = json::parse(io::read_file(table));
      } catch (const json::exception& e) {
        fail("%s: malformed JSON (%s)", table.c_str(), e.what());
      }
      files[size_t(r)] = file_from_json(j, table);
      if (files[size_t(r)].rank != r) fail("%s: names rank %d", table.c_str(), files[size_t(r)].rank);
      have[size_t(r)] = true;
    }
    return std::all_of(have.begin(), have.end(), [](bool b) { return b; });
  });
  if (!all) {
    std::string missing;
    for (int r = 0; r < job.world_size; r++)
      if (!have[size_t(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    // A wait on peers like any other (parallel/comm.h WaitPolicy): a hung rank ends the job as hung.
    throw parallel::PeerTimeoutError(strfmt("hung: timed out after %.1f s waiting for rank(s) %s to write their files to %s",
                                            o.commit_timeout_s, missing.c_str(), job.tmp_dir.c_str()),
                                     o.commit_timeout_s);
  }

  // 2. The manifest, written last: from here on the directory is a checkpoint.
  Manifest m;
  m.step = job.step;
  m.world_size = job.world_size;
  m.save_id = job.save_id;
  m.created_unix = unix_now();
  m.meta = job.global_meta;
  m.tensors = job.tensors;
  m.files = std::move(files);
  const std::string problem = table_problem(m);
  if (!problem.empty()) fail("the ranks' pieces do not form a complete checkpoint: %s", problem.c_str());
  io::write_file_atomically(io::join(job.tmp_dir, kManifestName), manifest_to_json(m).dump(1) + "\n");
  for (int r = 1; r < job.world_size; r++) ::unlink(io::join(job.tmp_dir, rank_table_name(r)).c_str());
  io::fsync_dir(job.tmp_dir);
  // The last moment before the commit: everything written, nothing published (`latest` included).
  fault_point(o, job.rank, job.step, "before_commit");

  // 3. Publish: one rename. A checkpoint of the same step already there (a re-save after resuming)
  // is swapped out atomically and then deleted, unless it does not verify: a damaged checkpoint is
  // moved aside (step_N.damaged-<save id>, which no reader or cleaner looks at), never deleted.
  if (io::exists(job.final_dir)) {
    std::string damage;
    try {
      verify(job.final_dir);
    } catch (const Error& e) {
      damage = e.what();
    }
    io::exchange_paths(job.tmp_dir, job.final_dir);
    io::fsync_dir(job.root);
    if (!damage.empty()) {
      const std::string aside = job.final_dir + ".damaged-" + job.save_id;
      io::rename_path(job.tmp_dir, aside);
      io::fsync_dir(job.root);
      MT_LOG_WARN(o.log, "checkpoint: the earlier %s does not verify (%s); kept as %s", job.final_dir.c_str(),
                  damage.c_str(), aside.c_str());
    } else {
      const std::string err = io::remove_tree(job.tmp_dir);
      if (!err.empty()) MT_LOG_WARN(o.log, "checkpoint: %s", err.c_str());
    }
  } else {
    io::rename_path(job.tmp_dir, job.final_dir);
    io::fsync_dir(job.root);
  }
  write_latest(job.root, step_dir_name(job.step));
  fault_point(o, job.rank, job.step, "after_commit");
  apply_retention(job.root, o.keep, o.log);
}

void await_commit(WriteJob& job, const Options& o) {
  bool abandoned = false;
  const bool ok = poll_until(job, o.commit_timeout_s, [&] {
    if (save_id_of(job.final_dir) == job.save_id) return true;
    // step_N.tmp is renamed to step_N in one step, so if it is gone and step_N is not ours, rank 0
    // gave up on this save (and reports why).
    if (!io::exists(job.tmp_dir)) {
      abandoned = save_id_of(job.final_dir) != job.save_id;
      return true;
    }
    return false;
  });
  if (abandoned)
    throw parallel::FollowOnError(strfmt("rank 0 abandoned the save (%s was removed without a commit; rank 0 reports why)",
                                         job.tmp_dir.c_str()));
  if (!ok)
    throw parallel::PeerTimeoutError(
        strfmt("hung: timed out after %.1f s waiting for rank 0 to commit %s", o.commit_timeout_s,
               job.final_dir.c_str()),
        o.commit_timeout_s);
  fault_point(o, job.rank, job.step, "after_commit");
}

void abandon(WriteJob& job, const std::string& why) noexcept {
  try {
    if (job.rank == 0) {
      // A slow rank may still be adding a file while the tree is removed: try again briefly.
      for (int attempt = 0; attempt < 5 && io::exists(job.tmp_dir); attempt++) {
        if (io::remove_tree(job.tmp_dir).empty()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      return;
    }
    if (job.published || !io::exists(job.tmp_dir)) return;
    ::unlink(io::join(job.tmp_dir, rank_file_name(job.rank)).c_str());
    io::write_file_atomically(io::join(job.tmp_dir, rank_failed_name(job.rank)), why);
  } catch (...) {
    // Best effort: on a full disk even the note may not fit; rank 0 then times out instead.
  }
}

}  // namespace mt::checkpoint
