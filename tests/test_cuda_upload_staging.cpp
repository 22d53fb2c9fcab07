// The pinned upload ring (kernels/cuda/upload_staging.h): uploads queued in the device's order without
// waiting for it, a ring region written again only after its copy ran, and an upload larger than the
// ring. On the simulated device the copies run only when waited for, so a region reused too early
// would hand a later upload's bytes to an earlier copy, deterministically. Skips without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/upload_staging.h"
#include "runtime/arena.h"

namespace mt::cuda {
namespace {

std::vector<int32_t> download(const void* d, size_t n) {
  std::vector<int32_t> v(n);
  copy_to_host(v.data(), d, n * 4);
  return v;
}

TEST(PinnedUploads, RingRegionIsWrittenAgainOnlyAfterItsCopyRan) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr size_t kInts = 4, kUploads = 40;
  PinnedUploads ring(4 * kInts * 4);  // room for four uploads: the fifth needs the first's region
  std::vector<void*> dst(kUploads);
  std::vector<int32_t> src(kInts);
  for (size_t u = 0; u < kUploads; u++) {
    dst[u] = device_alloc(kInts * 4);
    for (size_t i = 0; i < kInts; i++) src[i] = int32_t(100 * u + i);
    ring.upload(dst[u], src.data(), kInts * 4);  // the source is reused at once
  }
  synchronize();
  for (size_t u = 0; u < kUploads; u++) {
    const std::vector<int32_t> got = download(dst[u], kInts);
    for (size_t i = 0; i < kInts; i++) ASSERT_EQ(got[i], int32_t(100 * u + i)) << "upload " << u << " element " << i;
    device_free(dst[u]);
  }
}

TEST(PinnedUploads, UploadRunsInOrderWithTheWorkQueuedBeforeAndAfterIt) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr size_t n = 8;
  void* a = device_alloc(n * 4);
  void* b = device_alloc(n * 4);
  PinnedUploads ring;
  std::vector<int32_t> ones(n, 1), twos(n, 2);
  ring.upload(a, ones.data(), n * 4);
  device_memory().move(b, a, n * 4);  // queued on the default stream: must read the ones
  ring.upload(a, twos.data(), n * 4);
  synchronize();
  EXPECT_EQ(download(b, n), ones);
  EXPECT_EQ(download(a, n), twos);
  device_free(a);
  device_free(b);
}

// A DeviceWait that polls until ready and counts its waits (runtime/device_wait.h).
class CountingWait final : public DeviceWait {
 public:
  void until(const std::function<bool()>& ready, const char* what) const override {
    waits++;
    last = what;
    while (!ready()) {
    }
  }
  mutable int waits = 0;
  mutable std::string last;
};

// Given a DeviceWait (the trainer's polls under dist.timeout), the ring waits for a region's earlier
// copy through it, never in a blocking call that a hung collective ahead of the copy would hold forever.
TEST(PinnedUploads, ReusingARegionWaitsThroughTheDeviceWait) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr size_t kInts = 4, kUploads = 12;
  const CountingWait wait;
  PinnedUploads ring(4 * kInts * 4, &wait);  // room for four uploads
  std::vector<void*> dst(kUploads);
  std::vector<int32_t> src(kInts);
  for (size_t u = 0; u < kUploads; u++) {
    dst[u] = device_alloc(kInts * 4);
    for (size_t i = 0; i < kInts; i++) src[i] = int32_t(7 * u + i);
    ring.upload(dst[u], src.data(), kInts * 4);
  }
  EXPECT_EQ(wait.waits, int(kUploads - 4)) << "one wait per reused region";
  EXPECT_EQ(wait.last, "upload staging");
  synchronize();
  for (size_t u = 0; u < kUploads; u++) {
    const std::vector<int32_t> got = download(dst[u], kInts);
    for (size_t i = 0; i < kInts; i++) ASSERT_EQ(got[i], int32_t(7 * u + i)) << "upload " << u << " element " << i;
    device_free(dst[u]);
  }
}

TEST(PinnedUploads, UploadLargerThanTheRingGrowsIt) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  PinnedUploads ring(64);
  std::vector<int32_t> src(1000);
  for (size_t i = 0; i < src.size(); i++) src[i] = int32_t(i * 7);
  void* d = device_alloc(src.size() * 4);
  ring.upload(d, src.data(), src.size() * 4);
  EXPECT_GE(ring.capacity(), src.size() * 4);
  synchronize();
  EXPECT_EQ(download(d, src.size()), src);
  device_free(d);
}

TEST(PinnedUploads, ADeviceArenaUploadsThroughItsStaging) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Arena arena(device_memory());
  Buffer buf = arena.alloc(MemCategory::activations, 16);
  const std::vector<int32_t> v{5, 6, 7, 8};
  arena.upload(buf.data(), v.data(), 16);
  arena.mem().sync();
  EXPECT_EQ(download(buf.data(), 4), v);
}

}  // namespace
}  // namespace mt::cuda
