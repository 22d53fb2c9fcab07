// Numbers and durations as the progress line, the run summary and the planner print them. (strfmt,
// printf into a std::string, lives in runtime/check.h beside the checks that format their messages.)
#pragma once
#include <string>

namespace mt {

std::string format_count(double x);           // 12.3M, 4.56k, 789
std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"; "?" when negative or absurd

}  // namespace mt
