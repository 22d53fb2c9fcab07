// The one simulated device (sim/state.h) and the calling thread's state.
#include "sim/state.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mt::sim::detail {

Device::Device() : legacy(std::make_shared<CUstream_st>()) {
  legacy->legacy = true;
  // Eager mode is a debugging aid (sim.h); it is announced, never silent.
  if (const char* v = std::getenv("MT_SIM_EAGER"); v && *v) {
    if (std::strcmp(v, "1") == 0) {
      eager = true;
      std::fprintf(stderr, "simulated device: eager mode (MT_SIM_EAGER=1): every call runs its work at once\n");
    } else if (std::strcmp(v, "0") != 0) {
      std::fprintf(stderr, "simulated device: MT_SIM_EAGER=%s ignored (0 or 1)\n", v);
    }
  }
}

Device& device() {
  static Device* d = new Device;  // never destroyed: see state.h
  return *d;
}

ThreadState& this_thread() {
  static thread_local ThreadState t;
  return t;
}


}  // namespace mt::sim::detail

namespace mt::sim {

std::string format(const char* fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(size_t(n > 0 ? n : 0), '\0');
  std::vsnprintf(s.data(), s.size() + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

}  // namespace mt::sim
