#include "runtime/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/check.h"

namespace mt {

namespace {

std::string holder_text(int fd) {
  char buf[256];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  std::string s(buf, n > 0 ? size_t(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "a process that has not written its pid yet" : s;
}

// "pid 1234 on host node7[, run ID]\n"
std::string holder_line(const std::string& run_id) {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  return strfmt("pid %d on host %s%s\n", int(getpid()), host, run_id.empty() ? "" : (", run " + run_id).c_str());
}

bool write_text(int fd, const std::string& text) {
  return ::ftruncate(fd, 0) == 0 && ::pwrite(fd, text.data(), text.size(), 0) == ssize_t(text.size());
}

}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& what) : dir_(dir) {
  const std::string path = dir + "/" + kDirLockName;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail("%s: cannot lock %s: %s (errno %d)", what.c_str(), path.c_str(), std::strerror(errno), errno);
  int r;
  while ((r = ::flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (r != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? holder_text(fd) : "";
    ::close(fd);
    if (err == EWOULDBLOCK)
      fail("%s '%s' is in use by another run (%s); wait for it to end or choose another directory", what.c_str(),
           dir.c_str(), holder.c_str());
    fail("%s: cannot lock %s: %s (errno %d)", what.c_str(), path.c_str(), std::strerror(err), err);
  }
  const std::string text = holder_line("");
  if (!write_text(fd, text)) {
    const int err = errno;
    ::close(fd);
    fail("%s: writing %s: %s (errno %d)", what.c_str(), path.c_str(), std::strerror(err), err);
  }
  fd_ = fd;
}

void DirLock::set_run(const std::string& run_id) {
  if (fd_ < 0) return;
  if (!write_text(fd_, holder_line(run_id)))
    fail("writing %s/%s: %s (errno %d)", dir_.c_str(), kDirLockName, std::strerror(errno), errno);
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays, harmless to the next run
}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    dir_ = std::move(o.dir_);
    o.fd_ = -1;
  }
  return *this;
}

}  // namespace mt
