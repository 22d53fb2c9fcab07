// One run per directory: an advisory lock (flock(2)) on <dir>/run.lock, held while the object lives.
//
// The kernel releases a flock when its holder closes the file or dies (SIGKILL included), so a lock
// file left by a killed run never blocks a restart: only a live holder does. The file's text ("pid
// 1234 on host node7") is written by the holder for the message a second run prints; it plays no
// part in the locking.
#pragma once
#include <string>

namespace mt {

class DirLock {
 public:
  DirLock() = default;
  // Locks `dir` (which must exist), or throws mt::Error naming `what` (the option that chose the
  // directory), the directory and the holder:
  //   "out_dir 'runs/a' is in use by another run (pid 1234 on host node7); ..."
  DirLock(const std::string& dir, const std::string& what);
  ~DirLock();
  DirLock(DirLock&& o) noexcept : fd_(o.fd_), dir_(std::move(o.dir_)) { o.fd_ = -1; }
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  bool held() const { return fd_ >= 0; }
  // Adds the holder's run identity to the file's text ("pid 1234 on host node7, run 3f9c..."), so
  // that a second run's message names the run, not only the process.
  void set_run(const std::string& run_id);
  const std::string& dir() const { return dir_; }

 private:
  int fd_ = -1;
  std::string dir_;
};

inline constexpr const char* kDirLockName = "run.lock";

}  // namespace mt
