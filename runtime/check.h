// Error handling that stays on in release builds.
//
// MT_CHECK(cond, fmt, ...)  an invariant or a user-causable condition; throws mt::Error whose message
//                           names the statement, file and line, plus the formatted explanation.
// mt::fail(fmt, ...)        a user-facing error (bad flag, bad file): throws mt::Error with just the
//                           message, which the CLI prints as one line before exiting non-zero.
// MT_CUDA_CHECK / MT_CUBLAS_CHECK / MT_NCCL_CHECK / MT_MPI_CHECK live with their backends and use
// mt::detail::throw_status below.
#pragma once
#include <stdexcept>
#include <string>

namespace mt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// printf-style formatting into a std::string.
std::string strfmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

namespace detail {
[[noreturn]] void throw_check(const char* stmt, const char* file, int line, const std::string& msg);
[[noreturn]] void throw_status(const char* what, const char* stmt, const char* file, int line, long code,
                               const char* reason);
}  // namespace detail

}  // namespace mt

#define MT_CHECK(cond, ...)                                                              \
  do {                                                                                   \
    if (!(cond)) ::mt::detail::throw_check(#cond, __FILE__, __LINE__, ::mt::strfmt(__VA_ARGS__)); \
  } while (0)
