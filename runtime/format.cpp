#include "runtime/format.h"

#include "runtime/check.h"

namespace mt {

std::string format_count(double x) {
  if (x >= 1e9) return strfmt("%.2fG", x / 1e9);
  if (x >= 1e6) return strfmt("%.2fM", x / 1e6);
  if (x >= 1e3) return strfmt("%.2fk", x / 1e3);
  return strfmt("%.0f", x);
}

std::string format_duration(double s) {
  if (s < 0 || s > 1e9) return "?";
  long t = long(s + 0.5);
  if (t >= 3600) return strfmt("%ldh%02ldm", t / 3600, (t % 3600) / 60);
  if (t >= 60) return strfmt("%ldm%02lds", t / 60, t % 60);
  return strfmt("%lds", t);
}

}  // namespace mt
