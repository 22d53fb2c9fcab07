// POSIX file operations with the durability and error reporting a checkpoint needs.
//
// Durability follows the usual rules for crash-safe updates on Linux file systems: a file's data is
// durable after fsync(file); a new name (create, rename) is durable after fsync of the directory
// that holds it. Atomicity comes from rename(2), which replaces its target in one step.
//
// Every failure throws mt::Error naming the operation, the path and the errno text, e.g.
//   "writing ckpt/step_000120.tmp/rank_00001.bin: No space left on device (errno 28)".
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mt::checkpoint::io {

// Throws mt::Error "<what> <path>: <strerror(err)> (errno <err>)<suffix>".
[[noreturn]] void fail_errno(const char* what, const std::string& path, int err, const char* suffix = "");

// A file created (or truncated) for writing. Closed (without fsync) by the destructor.
class OutFile {
 public:
  explicit OutFile(const std::string& path);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  // Writes all n bytes (retrying short writes and EINTR).
  void write(const void* data, size_t n);
  // fsync(2): the data is on stable storage once this returns.
  void sync();
  void close();
  uint64_t written() const { return written_; }
  const std::string& path() const { return path_; }
  // Fault injection: every later write fails with `err` (e.g. ENOSPC), as a full disk would.
  void inject_error(int err) { injected_ = err; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
  int injected_ = 0;
};

// A file opened for reading with positioned reads.
class InFile {
 public:
  explicit InFile(const std::string& path);
  ~InFile();
  InFile(InFile&& o) noexcept;
  InFile& operator=(InFile&&) = delete;
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;

  uint64_t size() const { return size_; }
  // Reads exactly n bytes at `offset`; a short file is an error naming the path.
  void read_at(void* out, size_t n, uint64_t offset) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

void fsync_dir(const std::string& dir);
// Writes `text` to path.tmp, fsyncs it, renames it over `path` and fsyncs the directory.
void write_file_atomically(const std::string& path, const std::string& text);
std::string read_file(const std::string& path);
void rename_path(const std::string& from, const std::string& to);
// Swaps two existing paths in one atomic step (renameat2 RENAME_EXCHANGE).
void exchange_paths(const std::string& a, const std::string& b);
// mkdir -p; fails naming the directory (e.g. a read-only parent).
void make_dirs(const std::string& dir);
// rm -r; returns "" or a description of what could not be removed (callers decide whether it matters).
std::string remove_tree(const std::string& path);
bool exists(const std::string& path);
bool is_dir(const std::string& path);
// The names in a directory (not . and ..), sorted; fails naming the directory.
std::vector<std::string> list_dir(const std::string& dir);
// Fails with a clear message unless a file can be created in `dir` (a read-only directory).
void check_writable(const std::string& dir);
std::string join(const std::string& dir, const std::string& name);

}  // namespace mt::checkpoint::io
