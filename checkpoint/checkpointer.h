// Checkpointer: saves the training state of every rank as one checkpoint (format: format.h and
// docs/checkpoint_format.md), asynchronously, with an atomic commit.
//
// A save, seen from one rank:
//   foreground (blocks training)  wait for the previous save; agree on the step with the other ranks
//                                 (one tiny all-reduce); copy every piece into the staging buffer
//   background thread             write <dir>/step_N.tmp/rank_R.bin, fsync it, publish the rank's
//                                 table (rank_R.json, by rename: "my data is durable")
//     rank 0 then                 wait for every rank's table, write manifest.json (fsync), rename
//                                 step_N.tmp -> step_N (fsync <dir>), replace <dir>/latest by rename,
//                                 delete checkpoints beyond the newest `keep`
//     other ranks then            wait until step_N/ appears carrying this save's id
// The background thread makes no MPI calls: ranks coordinate through files on the shared checkpoint
// directory, so the trainer's communicators stay single-threaded (MPI_THREAD_FUNNELED is enough).
//
// Crash safety: a directory is a checkpoint only once it has a manifest, and the manifest is written
// after every rank file is durable; a killed save leaves a step_N.tmp/ that readers never look at and
// the next Checkpointer deletes. A failed save (ENOSPC, EIO, a rank that never finishes) removes its
// step_N.tmp/, leaves every earlier checkpoint as it was, and is raised by the next save()/wait(),
// agreed across the ranks (one report for the job, however many ranks failed).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/format.h"
#include "checkpoint/writer_thread.h"
#include "parallel/comm.h"
#include "runtime/log.h"

namespace mt::checkpoint {

// A piece of a tensor held by this rank: the elements [flat_begin, flat_end) of the row-major
// flattening of the global tensor `tensor` (ZeRO shards are flat ranges) or, with a box, of the box
// at box_offset with extent box_extent (a tensor-parallel block; format.h PieceSpan).
struct Piece {
  std::string tensor;  // e.g. "param/transformer.h.0.attn.c_attn.weight", "adam_m/...", "adam_v/..."
  int64_t flat_begin = 0, flat_end = 0;
  const float* data = nullptr;  // fp32 values of that range
  std::vector<int64_t> box_offset = {}, box_extent = {};  // empty: a flat piece
  PieceSpan span() const { return PieceSpan{flat_begin, flat_end, box_offset, box_extent}; }
};

struct SaveRequest {
  int64_t step = 0;
  std::vector<TensorInfo> tensors;  // the global tensor table (identical on every rank)
  // This rank's pieces. Over all ranks they must cover every tensor; a range held by several ranks
  // (replicated state) may be passed by one of them or by several (then readers take any copy, and
  // the bytes are stored more than once).
  std::vector<Piece> pieces;
  nlohmann::json rank_meta;    // this rank's small state (loader position, RNG streams), in its file
  nlohmann::json global_meta;  // model config, layout, optimizer step, loss scale... (rank 0's is stored)
};

// How the staging buffer is allocated and filled. The defaults (64-byte-aligned host memory, memcpy
// split over a few threads) fit the CPU backend. A GPU trainer passes page-locked allocation
// (cudaHostAlloc) and a device-to-host copy, so the copy runs at full link speed and this library
// stays free of CUDA. With a `copy` hook synchronous saves stage too (device memory is not readable).
struct StagingHooks {
  std::function<void*(size_t bytes)> alloc;
  std::function<void(void* p)> free;
  // Called by save() on the caller's thread before any copy of that save: marks where the device's
  // work stands, so that copies made later (on the writer's thread) read the state of this step and
  // need not wait behind the next step's work.
  std::function<void()> mark;
  std::function<void(void* dst, const void* src, size_t bytes)> copy;  // returns with dst filled
};

struct Options {
  std::string dir;  // the checkpoint root: <dir>/step_000120/, <dir>/latest
  int keep = 3;     // retention: the newest `keep` checkpoints stay (0: keep all)
  bool async = true;
  // Async only. false: save() copies the state before returning. true: the copy runs in the
  // background too, and the caller must call snapshot_fence() before it changes any piece's data
  // (e.g. before the next optimizer step), so the copy hides behind the next forward and backward.
  bool deferred_snapshot = false;
  // Async only: the background writer's scheduling priority (writer_thread.h says why idle).
  WriterPriority writer_priority = WriterPriority::idle;
  // Async only: when the saves keep waiting for the previous write (kFallbackAfter saves in a row
  // waited longer than kFallbackFactor times that write's CPU time, and at least kFallbackMinWaitS),
  // the background write costs the steps more than a synchronous one would: every later save of this
  // Checkpointer is synchronous (logged once; the ranks decide together). false: stay asynchronous
  // whatever it costs.
  bool sync_fallback = true;
  // Fault injection (tests): at the named phase of the save of `fault_step`, only on rank
  // `fault_rank`, SIGKILL this process: "staging" (before the copy), "write" (half of the rank file
  // written), "before_commit" (rank file durable; rank 0: every rank's file durable and the manifest
  // written in step_N.tmp, not yet renamed, `latest` untouched; other ranks: the file not yet
  // announced, so no commit can follow), "after_commit" (rank 0: renamed and `latest` updated,
  // before retention; other ranks: the commit seen).
  // "enospc" instead makes this rank's file writes fail with ENOSPC, as a full disk would; with
  // fault_rank kEveryRank, every rank's (one disk under all of them filling up). "slow_write" stalls
  // this rank's write halfway for kSlowWriteStallS, as a slow or overloaded filesystem would: the
  // stall ignores cancellation, like a write(2) blocked on the disk.
  // The trainer adds its own phases ("forward", "backward", "optimizer") through fault_point().
  std::string fault_phase;
  int64_t fault_step = -1;
  int fault_rank = 0;
  static constexpr int kEveryRank = -1;
  static constexpr double kSlowWriteStallS = 10;
  // How long rank 0 waits for the other ranks' files, and they for rank 0's commit, before the
  // save is declared failed, with a PeerTimeoutError (a hung peer: exit status 4). Generous: ranks
  // normally finish within the write time of one file. The trainer sets it to dist.timeout.
  double commit_timeout_s = 600;
  Logger log;  // cleaned directories, retention, failures
  StagingHooks staging;
};

// The fault phases Options::fault_phase accepts (for flag validation by the trainer).
bool is_fault_phase(const std::string& phase);
// SIGKILLs this process (after one line on stderr) when o.fault_phase == phase, step == o.fault_step
// and rank == o.fault_rank. The trainer calls it at its own phases too.
void fault_point(const Options& o, int rank, int64_t step, const char* phase);

struct WriteJob;  // one save's background work (write_job.h)

class Checkpointer {
 public:
  // Collective. Rank 0 creates `dir` if needed, checks that it is writable and deletes stale *.tmp
  // entries left by killed saves; every rank fails together (CollectiveError) if the directory is
  // unusable. `world` is a host communicator (MPI or self): save() exchanges a few integers on it.
  Checkpointer(const Options& o, parallel::Comm& world);
  // Waits for a pending save (a failure is logged, not thrown). While an exception unwinds the stack
  // it stops waiting for other ranks at once: the job is failing, and they may be gone. The save so
  // left unfinished is not reported (the exception is the job's one error), nor is another rank's
  // failure (that rank reports it); a save rank 0 committed meanwhile counts as done.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective: every rank calls it for the same step. Waits for the previous save (raising its
  // failure as wait() does), copies every piece into the staging buffer (so the caller may change its
  // weights right after it returns; with deferred_snapshot, after snapshot_fence()), then writes in a
  // background thread (async) or before returning (sync).
  void save(const SaveRequest& req);
  // Collective: every rank calls it at the same point. Until the last save is committed (rank 0) or
  // this rank's part is durable and the commit seen (other ranks). A failure of that save on any rank
  // is then thrown, once, on every rank alike: a parallel::AgreedError that one rank reports (the
  // lowest whose failure was its own, e.g. its write hit ENOSPC, not rank 0's view of that rank's
  // failure); its exit status is kExitHung when that failure was a wait on peers that timed out.
  void wait();
  // With deferred_snapshot: returns once the last save's staging copy is done, after which the
  // caller may change its data; its wait counts in that save's blocking time. Otherwise a no-op.
  void snapshot_fence();

  struct SaveStats {
    int64_t step = 0;
    double blocking_s = 0;    // time save() held the caller, stall included
    double background_s = 0;  // time of the background part (write, fsync, commit)
    size_t bytes = 0;         // this rank's file size
    double stall_s = 0;       // part of blocking_s spent waiting for the previous save
    double writer_cpu_s = 0;  // CPU time of the background part (its thread and its copy helpers)
    bool synchronous = false; // written in the foreground (sync saves, and async ones after the fallback)
  };
  static constexpr int kFallbackAfter = 2;
  // A synchronous save blocks for its CPU time plus its I/O waits: 1.3-1.45 times its CPU time in the
  // measurements of docs/perf.md. A wait beyond twice the write's CPU time is more than that.
  static constexpr double kFallbackFactor = 2.0;
  static constexpr double kFallbackMinWaitS = 0.05;
  // True once async saves have turned synchronous (Options::sync_fallback).
  bool fell_back() const { return fell_back_; }
  std::optional<SaveStats> last_completed() const;  // the last save that completed (for the JSONL)

  using Clock = std::chrono::steady_clock;
  // Seconds of [from, to] during which the last async save's background part was running: the
  // trainer asks it for each step, to show which steps ran beside a write (and shared the machine).
  double background_overlap(Clock::time_point from, Clock::time_point to) const;

  const Options& options() const { return o_; }

 private:
  // Joins the writer and hands over the failure of the last save (null: none), without the other ranks.
  std::exception_ptr join();
  void validate(const SaveRequest& req) const;
  // Returns whether every later save is synchronous (any rank asked for the fallback).
  bool agree_on_step(int64_t step, bool want_sync);
  bool wants_fallback(double stall);
  std::unique_ptr<WriteJob> make_job(const SaveRequest& req, bool stage);
  void stage(WriteJob& job);
  void run(WriteJob& job, bool stage_first);
  char* staging(size_t bytes);

  Options o_;
  parallel::Comm& world_;
  std::string run_id_;
  std::thread worker_;
  std::unique_ptr<WriteJob> job_;
  std::exception_ptr error_;
  std::atomic<bool> cancel_{false};
  mutable std::mutex mu_;  // guards last_ (written by the worker, read by last_completed())
  std::optional<SaveStats> last_;
  // The last background part's start and end on Clock, in ns since its epoch (end -1: running).
  std::atomic<int64_t> bg_begin_ns_{0}, bg_end_ns_{0};
  std::atomic<bool> priority_warned_{false};
  bool fell_back_ = false;
  int waits_in_a_row_ = 0;  // saves in a row that waited longer than the previous write's CPU time
  char* staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

}  // namespace mt::checkpoint
