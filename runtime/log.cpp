#include "runtime/log.h"

#include <cstdarg>

#include "runtime/check.h"

namespace mt {

void Logger::log(LogLevel lvl, const char* fmt, ...) const {
  if (!enabled(lvl)) return;
  static const char* names[] = {"debug", "info", "warn", "error"};
  va_list ap;
  va_start(ap, fmt);
  char buf[2048];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (rank_ >= 0)
    std::fprintf(out_, "[%s r%d] %s\n", names[int(lvl)], rank_, buf);
  else
    std::fprintf(out_, "[%s] %s\n", names[int(lvl)], buf);
  std::fflush(out_);
}

}  // namespace mt
