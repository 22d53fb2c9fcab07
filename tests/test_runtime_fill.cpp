// host_fill: fills of 8 MB or more go out through non-temporal stores (runtime/memory.cpp), with an
// ordinary head up to 16-byte alignment and an ordinary tail; split over the threads or on one. Every
// byte asked for is set and none beside it, whatever the alignment and length.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <vector>

#include "runtime/memory.h"

namespace mt {
namespace {

TEST(HostFill, LargeFillsSetExactlyTheirBytesAtAnyAlignmentOnOneOrMoreThreads) {
  const int saved = omp_get_max_threads();
  constexpr size_t kGuard = 64;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (size_t offset : {size_t(0), size_t(1), size_t(7), size_t(13)}) {
      for (size_t n : {size_t(8) << 20, (size_t(9) << 20) + 7, size_t(100), (size_t(12) << 20) + 61}) {
        std::vector<unsigned char> buf(n + offset + kGuard, 0xA5);
        for (int byte : {0, 0xFF, 0x3C}) {
          host_fill(buf.data() + offset, byte, n);
          size_t bad = 0;
          for (size_t i = 0; i < offset; i++) bad += buf[i] != 0xA5;
          for (size_t i = offset; i < offset + n; i++) bad += buf[i] != static_cast<unsigned char>(byte);
          for (size_t i = offset + n; i < buf.size(); i++) bad += buf[i] != 0xA5;
          ASSERT_EQ(bad, 0u) << threads << " threads, offset " << offset << ", " << n << " bytes of " << byte;
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace mt
