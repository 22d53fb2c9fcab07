#include "checkpoint/fsio.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "runtime/check.h"

namespace mt::checkpoint::io {

namespace fs = std::filesystem;

void fail_errno(const char* what, const std::string& path, int err, const char* suffix) {
  fail("%s %s: %s (errno %d)%s", what, path.c_str(), std::strerror(err), err, suffix);
}

OutFile::OutFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_errno("creating", path, errno);
}

OutFile::~OutFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutFile::write(const void* data, size_t n) {
  if (injected_) fail_errno("writing", path_, injected_, " [injected fault]");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Large writes are split so one call never exceeds what Linux transfers at once (~2 GiB).
    const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_errno("writing", path_, errno);
    }
    if (w == 0) fail_errno("writing", path_, EIO, " (write returned 0)");
    p += w;
    n -= size_t(w);
    written_ += uint64_t(w);
  }
}

void OutFile::sync() {
  if (::fsync(fd_) != 0) fail_errno("fsync of", path_, errno);
}

void OutFile::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_errno("closing", path_, errno);
}

InFile::InFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail_errno("opening", path, errno);
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    fail_errno("stat of", path, err);
  }
  size_ = uint64_t(st.st_size);
}

InFile::InFile(InFile&& o) noexcept : path_(std::move(o.path_)), fd_(o.fd_), size_(o.size_) { o.fd_ = -1; }

InFile::~InFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InFile::read_at(void* out, size_t n, uint64_t offset) const {
  if (offset + n > size_)
    fail("reading %s: %zu bytes at offset %llu run past the end of the file (%llu bytes): truncated?", path_.c_str(),
         n, (unsigned long long)offset, (unsigned long long)size_);
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, p, std::min<size_t>(n, size_t(1) << 30), off_t(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail_errno("reading", path_, errno);
    }
    if (r == 0) fail("reading %s: unexpected end of file at offset %llu", path_.c_str(), (unsigned long long)offset);
    p += r;
    n -= size_t(r);
    offset += uint64_t(r);
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail_errno("opening directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail_errno("fsync of directory", dir, err);
}

static std::string parent_of(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    OutFile f(tmp);
    f.write(text.data(), text.size());
    f.sync();
    f.close();
  }
  rename_path(tmp, path);
  fsync_dir(parent_of(path));
}

std::string read_file(const std::string& path) {
  InFile f(path);
  std::string s(size_t(f.size()), '\0');
  f.read_at(s.data(), s.size(), 0);
  return s;
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail_errno("renaming", from + " to " + to, errno);
}

void exchange_paths(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0)
    fail_errno("exchanging", a + " and " + b, errno);
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("cannot create directory %s: %s", dir.c_str(), ec.message().c_str());
  if (!is_dir(dir)) fail("%s exists but is not a directory", dir.c_str());
}

std::string remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  return ec ? strfmt("cannot remove %s: %s", path.c_str(), ec.message().c_str()) : std::string();
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> list_dir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) fail_errno("listing", dir, errno);
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

void check_writable(const std::string& dir) {
  const std::string probe = join(dir, ".write_probe.tmp");
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    fail("checkpoint directory %s is not writable: %s (errno %d)", dir.c_str(), std::strerror(err), err);
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

}  // namespace mt::checkpoint::io
