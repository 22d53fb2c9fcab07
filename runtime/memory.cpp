#include "runtime/memory.h"

#include <cstdlib>
#include <cstring>

#include "runtime/param_store.h"

namespace mt {

namespace {

void* host_alloc(size_t n) {
  // aligned_alloc wants a size that is a multiple of the alignment.
  const size_t rounded = (n + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p) std::memset(p, 0, rounded);
  return p;
}

// Poisoned, not zeroed: see MemOps::alloc_uninit.
void* host_alloc_poisoned(size_t n) {
  const size_t rounded = (n + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p) std::memset(p, 0xFF, rounded);
  return p;
}

void host_free(void* p) { std::free(p); }

void host_zero(void* p, size_t n) {
  if (n) std::memset(p, 0, n);
}

void host_copy(void* dst, const void* src, size_t n, CopyKind) {
  if (n && dst != src) std::memcpy(dst, src, n);
}

void host_sync() {}

constexpr MemOps kHost{Device::cpu,  host_alloc,    host_free, host_zero,
                       host_copy,    round_inplace, host_sync, host_alloc_poisoned};

}  // namespace

const MemOps& host_memory() { return kHost; }

}  // namespace mt
