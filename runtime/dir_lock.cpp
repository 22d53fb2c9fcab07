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
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  const std::string text = strfmt("pid %d on host %s\n", int(getpid()), host);
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != ssize_t(text.size())) {
    const int err = errno;
    ::close(fd);
    fail("%s: writing %s: %s (errno %d)", what.c_str(), path.c_str(), std::strerror(err), err);
  }
  fd_ = fd;
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
