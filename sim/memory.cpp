// Device and pinned host memory: the reserved device range, the registry of live and freed blocks,
// the range checks every stand-in applies to its pointers, and cudaMalloc/cudaFree/cudaHostAlloc/
// cudaFreeHost/cudaMemGetInfo.
#include <sys/mman.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "sim/state.h"

namespace mt::sim {
namespace detail {

namespace {

constexpr size_t kFreedHistory = size_t(1) << 16;  // freed blocks remembered for messages
constexpr size_t kDeviceAlignment = 256;           // what cudaMalloc guarantees

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The device block whose pages, or the inaccessible page after them, hold a.
const Block* near_block(const std::map<uintptr_t, Block>& m, uintptr_t a) {
  auto it = m.upper_bound(a);
  for (int i = 0; i < 2; i++) {
    if (it != m.end() && it->second.kind == Kind::device && a >= it->second.pages &&
        a < it->second.pages + it->second.page_bytes + page_size())
      return &it->second;
    if (it == m.begin()) break;
    --it;
  }
  return nullptr;
}

// "offset 8 in the cudaMalloc'd block of 64 bytes at 0x..." or "12 bytes past the end of ...".
void relative_to(char* buf, size_t n, const Block& b, uintptr_t a) {
  if (a < b.base) {
    std::snprintf(buf, n, "%zu bytes before the start of the %s'd block of %zu bytes at 0x%" PRIxPTR,
                  size_t(b.base - a), b.call, b.bytes, b.base);
  } else if (a >= b.base + b.bytes) {
    std::snprintf(buf, n, "%zu bytes past the end of the %s'd block of %zu bytes at 0x%" PRIxPTR,
                  size_t(a - (b.base + b.bytes)), b.call, b.bytes, b.base);
  } else {
    std::snprintf(buf, n, "offset %zu in the %s'd block of %zu bytes at 0x%" PRIxPTR, size_t(a - b.base), b.call,
                  b.bytes, b.base);
  }
}

}  // namespace

size_t page_size() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}

const Block* live_block(const void* p) {
  const auto& m = device().blocks;
  const auto a = uintptr_t(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  return a < it->second.base + it->second.bytes ? &it->second : nullptr;
}

void describe_into(char* buf, size_t n, uintptr_t a) {
  const Device& d = device();
  char rel[256];
  if (a == 0) {
    std::snprintf(buf, n, "a null pointer");
  } else if (const Block* b = live_block(reinterpret_cast<const void*>(a))) {
    relative_to(rel, sizeof rel, *b, a);
    std::snprintf(buf, n, "%s (%s)", b->kind == Kind::device ? "device memory" : "pinned host memory", rel);
  } else if (a < d.region || a >= d.region_end) {
    std::snprintf(buf, n, "pageable host memory");
  } else if (const Block* b = near_block(d.blocks, a)) {
    relative_to(rel, sizeof rel, *b, a);
    std::snprintf(buf, n, "outside every live allocation (%s)", rel);
  } else if (const Block* f = near_block(d.freed, a)) {
    relative_to(rel, sizeof rel, *f, a);
    std::snprintf(buf, n, "freed device memory (%s, freed by %s)", rel, f->freed_by);
  } else {
    std::snprintf(buf, n, "device address space outside every live allocation");
  }
}

std::string describe(const void* p) {
  char buf[512];
  describe_into(buf, sizeof buf, uintptr_t(p));
  return buf;
}

void check_device_range(const void* p, size_t n, const char* call, const char* what) {
  const Block* b = live_block(p);
  const auto a = uintptr_t(p);
  if (!b || b->kind != Kind::device)
    throw CudaError(bad_address_code(), format("%s: %s = 0x%" PRIxPTR " is %s, not live device memory", call, what, a,
                                               describe(p).c_str()));
  if (n > b->base + b->bytes - a)
    throw CudaError(bad_address_code(),
                    format("%s: %s = 0x%" PRIxPTR " + %zu bytes runs %zu bytes past the end of the %s'd block of "
                           "%zu bytes at 0x%" PRIxPTR,
                           call, what, a, n, size_t(a + n - (b->base + b->bytes)), b->call, b->bytes, b->base));
}

void check_host_range(const void* p, size_t n, const char* call, const char* what) {
  const Device& d = device();
  const auto a = uintptr_t(p);
  const Block* b = live_block(p);
  if (a == 0 || (a >= d.region && a < d.region_end) || (b && b->kind == Kind::device))
    throw CudaError(bad_address_code(), format("%s: %s = 0x%" PRIxPTR " is %s, not host memory", call, what, a,
                                               describe(p).c_str()));
  if (b && n > b->base + b->bytes - a)  // pinned: the sim knows where it ends
    throw CudaError(bad_address_code(),
                    format("%s: %s = 0x%" PRIxPTR " + %zu bytes runs %zu bytes past the end of the %s'd block of "
                           "%zu bytes at 0x%" PRIxPTR,
                           call, what, a, n, size_t(a + n - (b->base + b->bytes)), b->call, b->bytes, b->base));
}

void reserve_region(Device& d) {
  if (d.region) return;
  // Address space only (PROT_NONE, no swap reserved): pages cost memory once device work writes them.
  // The range is far larger than the device so that freed addresses need never be handed out again.
  for (size_t bytes = size_t(16) << 40; bytes >= (size_t(256) << 30); bytes /= 4) {
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) continue;
    d.region = d.next = uintptr_t(p);
    d.region_end = d.region + bytes;
    install_fault_handler(d);
    return;
  }
  throw CudaError(cudaErrorMemoryAllocation, "cannot reserve an address range for the simulated device");
}

void* allocate(Device& d, size_t bytes, Kind kind, const char* call) {
  const size_t page = page_size();
  Block b;
  b.bytes = bytes;
  b.call = call;
  b.kind = kind;
  if (kind == Kind::pinned) {
    void* p = std::aligned_alloc(page, round_up(bytes, page));
    if (!p)
      throw CudaError(cudaErrorMemoryAllocation, format("%s: %zu bytes of host memory not available", call, bytes));
    b.base = uintptr_t(p);
    d.blocks.emplace(b.base, b);
    return p;
  }
  if (bytes > kTotalMemory - d.device_bytes)
    throw CudaError(cudaErrorMemoryAllocation, format("%s: %zu bytes requested, %zu of %zu bytes free", call, bytes,
                                                      kTotalMemory - d.device_bytes, kTotalMemory));
  reserve_region(d);
  const size_t span = round_up(bytes, kDeviceAlignment);
  b.page_bytes = round_up(span, page);
  if (b.page_bytes + page > d.region_end - d.next)
    throw CudaError(cudaErrorMemoryAllocation,
                    format("%s: the simulated device's %zu GiB of address space is used up (freed addresses are not "
                           "handed out again, so that every use after free is caught)",
                           call, size_t((d.region_end - d.region) >> 30)));
  b.pages = d.next;
  b.base = b.pages + b.page_bytes - span;
  d.next += b.page_bytes + page;  // the page after the block stays inaccessible
  if (d.access_depth > 0) set_access(b, true);
  d.blocks.emplace(b.base, b);
  d.device_bytes += bytes;
  return reinterpret_cast<void*>(b.base);
}

void release(Device& d, uintptr_t base, const char* by) {
  auto it = d.blocks.find(base);
  Block b = it->second;
  d.blocks.erase(it);
  if (b.kind == Kind::pinned) {
    std::free(reinterpret_cast<void*>(b.base));
    return;
  }
  if (d.access_depth > 0) set_access(b, false);
  madvise(reinterpret_cast<void*>(b.pages), b.page_bytes, MADV_DONTNEED);  // give the memory back
  d.device_bytes -= b.bytes;
  b.freed_by = by;
  d.freed[b.base] = b;
  d.freed_order.push_back(b.base);
  if (d.freed_order.size() > kFreedHistory) {
    d.freed.erase(d.freed_order.front());
    d.freed_order.pop_front();
  }
}

void release_all(Device& d) {
  while (!d.blocks.empty()) release(d, d.blocks.begin()->first, "cudaDeviceReset");
}

}  // namespace detail

bool is_device(const void* p, size_t bytes) {
  std::lock_guard lock(detail::device().mutex);
  const detail::Block* b = detail::live_block(p);
  return b && b->kind == detail::Kind::device && bytes <= b->base + b->bytes - uintptr_t(p);
}

void require_device(const void* p, size_t bytes, const char* call, const char* what) {
  std::lock_guard lock(detail::device().mutex);
  detail::check_device_range(p, bytes, call, what);
}

}  // namespace mt::sim

using namespace mt::sim;
using namespace mt::sim::detail;

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  return api([&](Device& d) {
    if (!devPtr) throw CudaError(cudaErrorInvalidValue, "cudaMalloc: devPtr is null");
    *devPtr = size ? allocate(d, size, Kind::device, "cudaMalloc") : nullptr;
    return cudaSuccess;
  });
}

// Waits for all device work first, as the real cudaFree does.
cudaError_t cudaFree(void* devPtr) {
  return api([&](Device& d) {
    if (!devPtr) return cudaSuccess;
    d.device_syncs++;
    require_reached(d, run_all(d), "cudaFree");
    if (d.sticky != cudaSuccess) return d.sticky;
    const Block* b = live_block(devPtr);
    if (!b || b->kind != Kind::device || b->base != uintptr_t(devPtr))
      throw CudaError(cudaErrorInvalidValue, format("cudaFree: devPtr = %p is %s, not the start of a live device block",
                                                    devPtr, describe(devPtr).c_str()));
    release(d, b->base, "cudaFree");
    return cudaSuccess;
  });
}

namespace {

cudaError_t host_alloc(void** p, size_t size, unsigned flags, const char* call) {
  return api([&](Device& d) {
    if (!p) throw CudaError(cudaErrorInvalidValue, format("%s: the result pointer is null", call));
    constexpr unsigned kKnown = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
    if (flags & ~kKnown) throw CudaError(cudaErrorInvalidValue, format("%s: unknown flags 0x%x", call, flags));
    *p = size ? allocate(d, size, Kind::pinned, call) : nullptr;
    return cudaSuccess;
  });
}

}  // namespace

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  return host_alloc(pHost, size, flags, "cudaHostAlloc");
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return host_alloc(ptr, size, 0, "cudaMallocHost"); }

cudaError_t cudaFreeHost(void* ptr) {
  return api([&](Device& d) {
    if (!ptr) return cudaSuccess;
    d.device_syncs++;
    require_reached(d, run_all(d), "cudaFreeHost");
    if (d.sticky != cudaSuccess) return d.sticky;
    const Block* b = live_block(ptr);
    if (!b || b->kind != Kind::pinned || b->base != uintptr_t(ptr))
      throw CudaError(cudaErrorInvalidValue,
                      format("cudaFreeHost: ptr = %p is %s, not the start of a live pinned block", ptr,
                             describe(ptr).c_str()));
    release(d, b->base, "cudaFreeHost");
    return cudaSuccess;
  });
}

// Free memory follows the live device blocks (the sim keeps no freed memory in reserve).
cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  return api([&](Device& d) {
    if (!free || !total) throw CudaError(cudaErrorInvalidValue, "cudaMemGetInfo: a result pointer is null");
    *total = kTotalMemory;
    *free = kTotalMemory - d.device_bytes;
    return cudaSuccess;
  });
}
