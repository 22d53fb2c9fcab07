#include "runtime/check.h"

#include <cstdarg>
#include <cstdio>
#include <vector>

namespace mt {

static std::string vstrfmt(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap2);
  va_end(ap2);
  std::string s(n > 0 ? size_t(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), size_t(n) + 1, fmt, ap);
  return s;
}

std::string strfmt(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrfmt(fmt, ap);
  va_end(ap);
  return s;
}

void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrfmt(fmt, ap);
  va_end(ap);
  throw Error(s);
}

namespace detail {
void throw_check(const char* stmt, const char* file, int line, const std::string& msg) {
  throw Error(strfmt("%s (check `%s` failed at %s:%d)", msg.c_str(), stmt, file, line));
}
void throw_status(const char* what, const char* stmt, const char* file, int line, long code,
                  const char* reason) {
  throw Error(strfmt("%s error %ld (%s) in `%s` at %s:%d", what, code, reason ? reason : "?", stmt, file, line));
}
}  // namespace detail

}  // namespace mt
