#include "train/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "runtime/check.h"

namespace mt::train {

JsonlWriter::JsonlWriter(const std::string& path, bool append) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0644);
  if (fd_ < 0) fail("cannot open metrics file '%s' for writing: %s (errno %d)", path.c_str(), std::strerror(errno), errno);
  struct stat st{};
  regular_ = ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
  if (!regular_) return;  // a pipe or device: nothing to cut
  size_ = uint64_t(st.st_size);
  // Cut a torn last line: keep the bytes up to the last newline.
  const int rd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (rd < 0) fail("cannot read metrics file '%s': %s (errno %d)", path.c_str(), std::strerror(errno), errno);
  uint64_t keep = size_;
  char buf[4096];
  while (keep > 0) {
    const size_t n = size_t(std::min<uint64_t>(keep, sizeof buf));
    if (::pread(rd, buf, n, off_t(keep - n)) != ssize_t(n)) break;
    const void* nl = memrchr(buf, '\n', n);
    if (nl) {
      keep = keep - n + uint64_t(static_cast<const char*>(nl) - buf) + 1;
      break;
    }
    keep -= n;
  }
  ::close(rd);
  if (keep == size_) return;
  if (::ftruncate(fd_, off_t(keep)) != 0)
    fail("cutting the torn last line of '%s': %s (errno %d)", path.c_str(), std::strerror(errno), errno);
  cut_ = size_ - keep;
  size_ = keep;
}

JsonlWriter::~JsonlWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JsonlWriter::write(const nlohmann::json& j) {
  if (fd_ < 0) return;
  const std::string line = j.dump() + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : EIO;
      // No torn record for a reader: the part that reached the file goes (best effort; a device
      // such as a pipe cannot be cut).
      if (done > 0 && regular_) (void)!::ftruncate(fd_, off_t(size_));
      fail("writing %s: %s (errno %d)", path_.c_str(), std::strerror(err), err);
    }
    done += size_t(w);
  }
  size_ += line.size();
}

plan::Peak calibrate_cpu_peak(int threads, double min_seconds) {
  // A square fp32 GEMM through the same matmul op the model uses; best of a few repetitions.
  const int n = 1024;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  ops::Ctx ctx;
  ops::matmul_fwd<float>(c.data(), a.data(), b.data(), nullptr, n, n, n, ctx);  // warm-up
  // Best of at least 8 repetitions and min_seconds: the peak is what the GEMM reaches when it has
  // the cores to itself, so a momentarily busy machine must not lower it (MFU would read high).
  double best = 1e30, spent = 0;
  for (int rep = 0; rep < 8 || spent < min_seconds; rep++) {
    auto t0 = std::chrono::steady_clock::now();
    ops::matmul_fwd<float>(c.data(), a.data(), b.data(), nullptr, n, n, n, ctx);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, t);
    spent += t;
    if (rep > 200) break;
  }
  plan::Peak p;
  p.flops = 2.0 * n * n * double(n) / best;
  p.label = strfmt("calibrated CPU fp32 GEMM %dx%dx%d, %d threads", n, n, n, threads);
  return p;
}

nlohmann::json memory_json(const MemStats& s) {
  nlohmann::json j;
  for (int i = 0; i < kNumMemCategories; i++) j[mem_category_name(MemCategory(i))] = s.peak[size_t(i)];
  j["total"] = s.peak_total;
  return j;
}

}  // namespace mt::train
