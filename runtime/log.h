// A minimal logger: one line per message on stderr, prefixed with the level and, when set, the rank.
// The rank prefix is part of a Logger value passed around, not global state.
#pragma once
#include <cstdio>
#include <string>

namespace mt {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };

class Logger {
 public:
  explicit Logger(LogLevel level = LogLevel::info, int rank = -1, FILE* out = stderr)
      : level_(level), rank_(rank), out_(out) {}
  void log(LogLevel lvl, const char* fmt, ...) const __attribute__((format(printf, 3, 4)));
  bool enabled(LogLevel lvl) const { return lvl >= level_; }
  int rank() const { return rank_; }

 private:
  LogLevel level_;
  int rank_;
  FILE* out_;
};

}  // namespace mt

#define MT_LOG_INFO(logger, ...) (logger).log(::mt::LogLevel::info, __VA_ARGS__)
#define MT_LOG_WARN(logger, ...) (logger).log(::mt::LogLevel::warn, __VA_ARGS__)
