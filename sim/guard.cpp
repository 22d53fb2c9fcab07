// Device memory is out of the host's reach: its pages are PROT_NONE except inside a DeviceAccess
// scope (the sim running queued work), and a SIGSEGV inside the device range is reported as the
// misuse it is, one line naming the block, then abort(). Faults elsewhere go to the handler that was
// installed before ours.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "sim/state.h"

namespace mt::sim {
namespace detail {

void set_access(const Block& b, bool open) {
  if (mprotect(reinterpret_cast<void*>(b.pages), b.page_bytes, open ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
    throw CudaError(cudaErrorUnknown,
                    format("mprotect of the %s'd block at 0x%" PRIxPTR " failed: %s (too many live blocks for "
                           "vm.max_map_count?)",
                           b.call, b.base, std::strerror(errno)));
}

namespace {

void write_line(const char* s) {
  ssize_t rc = write(STDERR_FILENO, s, std::strlen(s));
  (void)rc;
}

// Runs on the faulting thread. It reads the registry without the lock (the process is about to end)
// and allocates nothing.
void on_fault(int sig, siginfo_t* info, void* context) {
  (void)sig;
  (void)context;
  Device& d = device();
  const auto a = uintptr_t(info->si_addr);
  if (a < d.region || a >= d.region_end) {
    sigaction(SIGSEGV, &d.previous_segv, nullptr);  // not ours: the access faults again under it
    return;
  }
  char what[512], line[1024];
  describe_into(what, sizeof what, a);
  const Block* b = live_block(reinterpret_cast<const void*>(a));
  if (!this_thread().in_device_work && b) {
    std::snprintf(line, sizeof line,
                  "simulated device: host code read or wrote device memory at 0x%" PRIxPTR
                  " (%s'd block of %zu bytes) outside device work\n",
                  a, b->call, b->bytes);
  } else if (!this_thread().in_device_work) {
    std::snprintf(line, sizeof line, "simulated device: host code read or wrote 0x%" PRIxPTR ", %s\n", a, what);
  } else {
    std::snprintf(line, sizeof line, "simulated device: device work '%s' read or wrote 0x%" PRIxPTR ", %s\n",
                  d.running ? d.running->c_str() : "?", a, what);
  }
  write_line(line);
  abort();
}

}  // namespace

void install_fault_handler(Device& d) {
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &d.previous_segv);
}

}  // namespace detail

DeviceAccess::DeviceAccess() {
  detail::Device& d = detail::device();
  std::lock_guard lock(d.mutex);
  if (d.access_depth++ > 0) return;
  try {
    for (const auto& [base, b] : d.blocks)
      if (b.kind == detail::Kind::device) detail::set_access(b, true);
  } catch (...) {
    d.access_depth--;
    throw;
  }
}

DeviceAccess::~DeviceAccess() {
  detail::Device& d = detail::device();
  std::lock_guard lock(d.mutex);
  if (--d.access_depth == 0) {
    for (const auto& [base, b] : d.blocks) {
      if (b.kind != detail::Kind::device) continue;
      if (mprotect(reinterpret_cast<void*>(b.pages), b.page_bytes, PROT_NONE) != 0) {
        std::fprintf(stderr, "simulated device: cannot protect device memory again: %s\n", std::strerror(errno));
        abort();  // a destructor cannot throw, and an open device would hide every later misuse
      }
    }
  }
}

}  // namespace mt::sim
