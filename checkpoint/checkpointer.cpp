#include "checkpoint/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <unordered_map>

#include "checkpoint/catalog.h"
#include "checkpoint/fsio.h"
#include "checkpoint/write_job.h"
#include "parallel/launch.h"
#include "runtime/check.h"

namespace mt::checkpoint {

using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// hang and straggler are the trainer's (train/stragglers.h): a stopped rank, a slow one.
constexpr const char* kFaultPhases[] = {"forward", "backward",      "optimizer",    "staging", "write",
                                        "before_commit", "after_commit", "enospc", "slow_write", "hang",
                                        "straggler", "preempt"};

int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// The staging copy: memcpy split into 16 MiB tasks over a few threads, since one core cannot
// saturate memory bandwidth. Plain threads rather than OpenMP keep this safe in forked children.
// Returns the CPU time of the helper threads (the caller's own is in its thread's clock).
double parallel_copy(const std::vector<CopyTask>& pieces) {
  constexpr size_t kTask = size_t(16) << 20;
  std::vector<CopyTask> tasks;
  size_t total = 0;
  for (const CopyTask& p : pieces) {
    for (size_t at = 0; at < p.bytes; at += kTask)
      tasks.push_back({p.dst + at, p.src + at, std::min(kTask, p.bytes - at)});
    total += p.bytes;
  }
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t nthreads = std::min<size_t>({size_t(8), size_t(hw), tasks.size(), total / kTask + 1});
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < tasks.size();) std::memcpy(tasks[i].dst, tasks[i].src, tasks[i].bytes);
  };
  std::vector<std::thread> helpers;
  std::vector<double> helper_cpu(nthreads, 0.0);
  for (size_t t = 1; t < nthreads; t++)
    helpers.emplace_back([&, t] {
      work();
      helper_cpu[t] = this_thread_cpu_s();
    });
  work();
  for (std::thread& t : helpers) t.join();
  double cpu = 0;
  for (double c : helper_cpu) cpu += c;
  return cpu;
}

// Whether `dir` is gone, or goes within a second (rank 0's abandon() removing it).
bool vanishes(const std::string& dir) {
  for (int i = 0; i < 100 && io::exists(dir); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return !io::exists(dir);
}

}  // namespace

bool is_fault_phase(const std::string& phase) {
  return std::any_of(std::begin(kFaultPhases), std::end(kFaultPhases), [&](const char* p) { return phase == p; });
}

void fault_point(const Options& o, int rank, int64_t step, const char* phase) {
  if (o.fault_phase != phase || o.fault_step != step || o.fault_rank != rank || o.fault_phase == "enospc") return;
  std::fprintf(stderr, "[fault] rank %d: SIGKILL at step %lld, phase %s\n", rank, (long long)step, phase);
  std::fflush(stderr);
  std::raise(SIGKILL);
}

Checkpointer::Checkpointer(const Options& o, parallel::Comm& world) : o_(o), world_(world) {
  if (o_.dir.empty()) fail("checkpoint: no checkpoint directory given");
  if (o_.keep < 0) fail("checkpoint: keep=%d: the number of checkpoints kept must be >= 0 (0 keeps all)", o_.keep);
  if (!o_.fault_phase.empty() && !is_fault_phase(o_.fault_phase))
    fail("checkpoint: unknown fault phase '%s' (forward, backward, optimizer, staging, write, before_commit, "
         "after_commit, enospc, slow_write, hang, straggler, preempt)",
         o_.fault_phase.c_str());
  if (o_.commit_timeout_s <= 0) fail("checkpoint: commit timeout must be positive");
  MT_CHECK(world_.device() == Device::cpu, "checkpoint: the communicator '%s' must be a host (MPI or self) one",
           world_.name().c_str());
  int32_t msg[3] = {0, 0, 0};  // status, run id low and high halves
  std::string why;
  if (world_.rank() == 0) {
    try {
      io::make_dirs(o_.dir);
      io::check_writable(o_.dir);
      clean_stale(o_.dir, o_.log);
    } catch (const Error& e) {
      msg[0] = 1;
      why = e.what();
    }
    const uint64_t id = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
    msg[1] = int32_t(uint32_t(id));
    msg[2] = int32_t(uint32_t(id >> 32));
  }
  world_.broadcast(msg, 3, DType::i32, 0);
  if (msg[0] != 0)
    throw parallel::CollectiveError(world_.rank() == 0 ? why
                                                       : strfmt("checkpoint directory %s is unusable (see rank 0)",
                                                                o_.dir.c_str()));
  run_id_ = strfmt("%08x%08x", uint32_t(msg[2]), uint32_t(msg[1]));
}

Checkpointer::~Checkpointer() {
  if (std::uncaught_exceptions() > 0) cancel_ = true;
  try {
    // Alone: a destructor cannot count on the other ranks to meet it in a collective.
    if (const std::exception_ptr e = join()) std::rethrow_exception(e);
  } catch (const SaveCancelled&) {
    // The process is failing: the error it reports is its own, not that of the save it left unfinished.
  } catch (const parallel::FollowOnError&) {
    // Another rank's failure, which that rank reports.
  } catch (const std::exception& e) {
    o_.log.log(LogLevel::error, "%s", e.what());
  }
  if (staging_) {
    if (o_.staging.free)
      o_.staging.free(staging_);
    else
      std::free(staging_);
  }
}

std::exception_ptr Checkpointer::join() {
  if (worker_.joinable()) worker_.join();
  job_.reset();
  std::exception_ptr e = error_;
  error_ = nullptr;
  return e;
}

// A save's failure is agreed before it is raised: a full disk fails every rank's write at once, and
// a rank's failed write fails rank 0's commit and the other ranks' waits for it, but the job reports
// one failure, from one rank (parallel/launch.h raise_agreed_failure).
void Checkpointer::wait() { parallel::raise_agreed_failure(world_, join()); }

std::optional<Checkpointer::SaveStats> Checkpointer::last_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

void Checkpointer::validate(const SaveRequest& req) const {
  if (req.step < 0 || req.step > INT32_MAX) fail("checkpoint: step %lld is out of range", (long long)req.step);
  std::unordered_map<std::string, const TensorInfo*> index;
  for (const TensorInfo& t : req.tensors) {
    if (t.dtype != DType::f32)
      fail("checkpoint: tensor '%s' has dtype %s; pieces are fp32 only so far", t.name.c_str(), dtype_name(t.dtype));
    if (!index.emplace(t.name, &t).second) fail("checkpoint: tensor '%s' is listed twice", t.name.c_str());
  }
  for (const Piece& p : req.pieces) {
    auto it = index.find(p.tensor);
    if (it == index.end()) fail("checkpoint: a piece names '%s', which is not in the tensor table", p.tensor.c_str());
    const std::string problem = p.span().problem(it->second->global_shape);
    if (!problem.empty()) fail("checkpoint: a piece of '%s' %s", p.tensor.c_str(), problem.c_str());
    if (p.data == nullptr && p.flat_end > p.flat_begin)
      fail("checkpoint: piece of '%s' has no data pointer", p.tensor.c_str());
  }
}

// One all-reduce (max of step, -step, a failure flag and a fallback vote): every rank is saving the
// same step, rank 0 has created step_N.tmp/ (so no rank writes before it exists, or into a stale
// one), and the ranks agree on whether saves are synchronous from now on.
bool Checkpointer::agree_on_step(int64_t step, bool want_sync) {
  const std::string tmp = io::join(o_.dir, step_dir_name(step) + ".tmp");
  int32_t buf[4] = {int32_t(step), -int32_t(step), 0, want_sync ? 1 : 0};
  std::string why;
  if (world_.rank() == 0) {
    try {
      if (io::exists(tmp)) {
        const std::string err = io::remove_tree(tmp);
        if (!err.empty()) fail("%s", err.c_str());
      }
      io::make_dirs(tmp);
    } catch (const Error& e) {
      buf[2] = 1;
      why = e.what();
    }
  }
  world_.all_reduce(buf, 4, DType::i32, parallel::ReduceOp::max);
  if (buf[2] != 0)
    throw parallel::CollectiveError(strfmt("checkpoint save of step %lld failed: %s", (long long)step,
                                           world_.rank() == 0 ? why.c_str() : "rank 0 could not create its directory"));
  if (buf[0] != -buf[1])
    throw parallel::CollectiveError(strfmt("checkpoint: save() was called for different steps on different ranks "
                                           "(from %d to %d); every rank must save the same step", -buf[1], buf[0]));
  return buf[3] != 0;
}

// An async save that waits for the previous write longer than a synchronous save of it would have
// blocked (estimated as kFallbackFactor times the write's CPU time) gains nothing over writing in the
// foreground: the write did not fit beside the steps (a save interval too short, a busy disk, or an
// idle-priority writer starved by other jobs). After kFallbackAfter such saves in a row the rank
// votes for synchronous saves.
bool Checkpointer::wants_fallback(double stall) {
  if (!o_.async || !o_.sync_fallback || fell_back_) return false;
  const std::optional<SaveStats> previous = last_completed();
  const double write_cpu = previous ? previous->writer_cpu_s : 0.0;
  waits_in_a_row_ = stall > kFallbackMinWaitS && stall > kFallbackFactor * write_cpu ? waits_in_a_row_ + 1 : 0;
  return waits_in_a_row_ >= kFallbackAfter;
}

char* Checkpointer::staging(size_t bytes) {
  if (bytes <= staging_bytes_) return staging_;
  if (staging_) {
    if (o_.staging.free)
      o_.staging.free(staging_);
    else
      std::free(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
  }
  const size_t rounded = (bytes + 63) / 64 * 64;
  staging_ = static_cast<char*>(o_.staging.alloc ? o_.staging.alloc(rounded) : std::aligned_alloc(64, rounded));
  if (!staging_) fail("checkpoint: cannot allocate a %zu-byte staging buffer", rounded);
  staging_bytes_ = rounded;
  return staging_;
}

std::unique_ptr<WriteJob> Checkpointer::make_job(const SaveRequest& req, bool stage) {
  auto job = std::make_unique<WriteJob>();
  job->rank = world_.rank();
  job->world_size = world_.size();
  job->step = req.step;
  job->root = o_.dir;
  job->final_dir = io::join(o_.dir, step_dir_name(req.step));
  job->tmp_dir = job->final_dir + ".tmp";
  job->save_id = run_id_ + "-" + std::to_string(req.step);
  job->header = encode_header(job->rank, job->world_size, req.step);
  job->meta_text = req.rank_meta.dump();
  job->file.name = rank_file_name(job->rank);
  job->file.rank = job->rank;
  job->cancel = &cancel_;

  size_t piece_bytes = 0;
  for (const Piece& p : req.pieces) piece_bytes += size_t(p.flat_end - p.flat_begin) * sizeof(float);
  char* stage_at = stage && piece_bytes > 0 ? staging(piece_bytes) : nullptr;
  std::vector<CopyTask>& copies = job->copies;
  uint64_t offset = kHeaderBytes;
  job->segments.push_back({job->header.data(), job->header.size(), -1});
  for (const Piece& p : req.pieces) {
    const size_t n = size_t(p.flat_end - p.flat_begin) * sizeof(float);
    PieceRecord r;
    static_cast<PieceSpan&>(r) = p.span();
    r.tensor = p.tensor;
    r.offset = offset;
    r.length = n;
    const char* src = reinterpret_cast<const char*>(p.data);
    if (stage_at) {
      copies.push_back({stage_at, src, n});
      src = stage_at;
      stage_at += n;
    }
    job->segments.push_back({src, n, int(job->file.pieces.size())});
    job->file.pieces.push_back(std::move(r));
    offset += n;
  }
  job->file.meta = {offset, job->meta_text.size(), 0};
  job->segments.push_back({job->meta_text.data(), job->meta_text.size(), -1});
  job->file.bytes = offset + job->meta_text.size();
  if (job->rank == 0) {
    job->tensors = req.tensors;
    job->global_meta = req.global_meta;
  }
  return job;
}

void Checkpointer::stage(WriteJob& job) {
  // Marks the job staged however the copy ends, so snapshot_fence() cannot wait forever; a failed
  // copy fails the save (run() reports it).
  struct Staged {
    WriteJob& job;
    ~Staged() {
      std::lock_guard<std::mutex> lock(job.mu);
      job.staged = true;
      job.staged_cv.notify_all();
    }
  } staged{job};
  if (o_.staging.copy)
    for (const CopyTask& c : job.copies) o_.staging.copy(c.dst, c.src, c.bytes);
  else
    job.copy_helper_cpu_s = parallel_copy(job.copies);
}

void Checkpointer::snapshot_fence() {
  if (!job_) return;
  const auto t0 = Clock::now();
  {
    std::unique_lock<std::mutex> lock(job_->mu);
    job_->staged_cv.wait(lock, [&] { return job_->staged; });
  }
  // The wait held the training loop: it belongs to this save's blocking time.
  const double waited = since(t0);
  std::lock_guard<std::mutex> lock(mu_);
  job_->stats.blocking_s += waited;
  if (last_ && last_->step == job_->stats.step) last_->blocking_s += waited;
}

void Checkpointer::save(const SaveRequest& req) {
  const auto t0 = Clock::now();
  wait();
  const double stall = since(t0);
  validate(req);
  const bool want_sync = wants_fallback(stall);
  if (agree_on_step(req.step, want_sync) && !fell_back_) {
    fell_back_ = true;
    if (world_.rank() == 0)
      MT_LOG_WARN(o_.log, "checkpoint: %d saves in a row waited for the previous background write longer than a "
                  "synchronous save would block (the last waited %.2f s): writing synchronously from step %lld on "
                  "(ckpt.sync_fallback=false keeps async saves)", kFallbackAfter, stall, (long long)req.step);
  }
  const bool async = o_.async && !fell_back_;
  fault_point(o_, world_.rank(), req.step, "staging");
  if (o_.staging.mark) o_.staging.mark();
  job_ = make_job(req, async || bool(o_.staging.copy));
  job_->stats = {req.step, 0, 0, size_t(job_->file.bytes), stall};
  job_->stats.synchronous = !async;
  const bool deferred = async && o_.deferred_snapshot;
  if (!deferred) stage(*job_);
  if (async) {
    job_->stats.blocking_s = since(t0);
    bg_end_ns_ = -1;
    bg_begin_ns_ = ns_of(Clock::now());
    worker_ = std::thread([this, deferred] {
      const std::string why = set_this_thread_priority(o_.writer_priority);
      if (!why.empty() && !priority_warned_.exchange(true)) MT_LOG_WARN(o_.log, "checkpoint: %s", why.c_str());
      run(*job_, deferred);
      bg_end_ns_ = ns_of(Clock::now());
    });
    return;
  }
  run(*job_, false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (last_ && last_->step == req.step) last_->blocking_s = since(t0);
  }
  wait();  // a synchronous save's failure is thrown right away
}

double Checkpointer::background_overlap(Clock::time_point from, Clock::time_point to) const {
  const int64_t begin = bg_begin_ns_, end = bg_end_ns_;
  if (begin == 0) return 0;  // no async save yet
  const int64_t lo = std::max(begin, ns_of(from)), hi = std::min(end < 0 ? ns_of(to) : end, ns_of(to));
  return hi > lo ? 1e-9 * double(hi - lo) : 0.0;
}

void Checkpointer::run(WriteJob& job, bool stage_first) {
  const auto t0 = Clock::now();
  const double cpu0 = this_thread_cpu_s();
  try {
    if (stage_first) stage(job);
    write_rank_file(job, o_);
    if (job.rank == 0) {
      commit(job, o_);
    } else {
      // Killed here, this rank's file is durable but never announced, so rank 0 cannot commit.
      fault_point(o_, job.rank, job.step, "before_commit");
      publish_table(job);
      await_commit(job, o_);
    }
    job.stats.background_s = since(t0);
    job.stats.writer_cpu_s = this_thread_cpu_s() - cpu0 + (stage_first ? job.copy_helper_cpu_s : 0.0);
    std::lock_guard<std::mutex> lock(mu_);
    last_ = job.stats;
  } catch (const std::exception& e) {
    // Cancelled while waiting for the other ranks (the process is failing): a save that rank 0 has
    // committed meanwhile is complete and verifies; one it has not is left unfinished, and reported by
    // no one (SaveCancelled; the process reports its own error).
    const bool cancelled = dynamic_cast<const SaveCancelled*>(&e) != nullptr;
    if (cancelled && committed(job)) {
      job.stats.background_s = since(t0);
      std::lock_guard<std::mutex> lock(mu_);
      last_ = job.stats;
      return;
    }
    std::string why = e.what();
    // Another rank's failure (reported there) or this rank's own (reported here): see FollowOnError.
    bool follow_on = dynamic_cast<const parallel::FollowOnError*>(&e) != nullptr;
    // A path of this save vanished under another rank: rank 0 removes step_N.tmp when it abandons the
    // save (and retries while files appear in it), so wait for it to be gone before calling it ours.
    if (job.rank != 0 && why.find("No such file or directory") != std::string::npos && vanishes(job.tmp_dir)) {
      why = strfmt("rank 0 abandoned the save (it removed %s while this rank was writing; rank 0 reports why)",
                   job.tmp_dir.c_str());
      follow_on = true;
    }
    abandon(job, why);
    const std::string what = strfmt("checkpoint save of step %lld to %s failed on rank %d: %s; the earlier checkpoints "
                                    "are untouched", (long long)job.step, o_.dir.c_str(), job.rank, why.c_str());
    if (cancelled)
      error_ = std::make_exception_ptr(SaveCancelled(what));
    else if (const auto* hung = dynamic_cast<const parallel::PeerTimeoutError*>(&e))
      error_ = std::make_exception_ptr(parallel::PeerTimeoutError(what, hung->timeout_s()));  // exit status 4
    else
      error_ = follow_on ? std::make_exception_ptr(parallel::FollowOnError(what)) : std::make_exception_ptr(Error(what));
  }
}

}  // namespace mt::checkpoint
