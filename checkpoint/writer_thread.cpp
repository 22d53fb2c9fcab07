#include "checkpoint/writer_thread.h"

#include <sched.h>
#include <time.h>

#include <cerrno>
#include <cstring>

#include "runtime/check.h"

namespace mt::checkpoint {

WriterPriority writer_priority_from_name(const std::string& name, const char* flag) {
  if (name == "normal") return WriterPriority::normal;
  if (name == "idle") return WriterPriority::idle;
  fail("%s '%s' is not a writer priority (normal, idle)", flag, name.c_str());
}

const char* writer_priority_name(WriterPriority p) { return p == WriterPriority::idle ? "idle" : "normal"; }

std::string set_this_thread_priority(WriterPriority p) {
  if (p == WriterPriority::normal) return "";
  sched_param param{};
  param.sched_priority = 0;
  // pid 0: on Linux, the calling thread (scheduling policies are per thread).
  if (sched_setscheduler(0, SCHED_IDLE, &param) != 0)
    return strfmt("cannot give the checkpoint writer idle priority (SCHED_IDLE): %s", std::strerror(errno));
  return "";
}

double this_thread_cpu_s() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace mt::checkpoint
