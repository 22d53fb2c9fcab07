// The checkpoint snapshot's copy stream (kernels/cuda/snapshot_copy.h): a copy reads the state as of
// the save's mark, on another thread, without waiting for work queued after the mark. On the simulated
// device queued work runs only when waited for, so a copy that ignored the mark would read the state
// before it (stale), and one ordered behind the compute stream would read the state after it.
// Skips without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/snapshot_copy.h"

namespace mt::cuda {
namespace {

TEST(SnapshotCopier, CopyReadsTheStateAsOfTheMarkFromAnotherThread) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  constexpr size_t n = 16;
  const std::vector<int32_t> a(n, 1), b(n, 2), c(n, 3);
  void* x = device_alloc(n * 4);
  void* vb = device_alloc(n * 4);
  void* vc = device_alloc(n * 4);
  copy_to_device(x, a.data(), n * 4);
  copy_to_device(vb, b.data(), n * 4);
  copy_to_device(vc, c.data(), n * 4);
  SnapshotCopier copier(nullptr);
  const MemOps& mem = device_memory();
  mem.move(x, vb, n * 4);  // queued on the compute stream: the state to save
  copier.mark();
  mem.move(x, vc, n * 4);  // the next step's work, queued after the save
  int32_t* staged = static_cast<int32_t*>(pinned_alloc(n * 4));
  std::thread writer([&] { copier.copy(staged, x, n * 4); });
  writer.join();
  const std::vector<int32_t> got(staged, staged + n);
#ifdef MT_CUDA_SIM
  EXPECT_EQ(got, b) << "the copy must read the marked state: not before it, and not wait for later work";
#else
  EXPECT_TRUE(got == b || got == c) << "the copy read the state before the mark";
#endif
  synchronize();
  pinned_free(staged);
  device_free(x);
  device_free(vb);
  device_free(vc);
}

}  // namespace
}  // namespace mt::cuda
