// Error codes, their standard strings, and the calling thread's last error and message.
#include <cstdio>

#include "sim/state.h"

namespace mt::sim {

using namespace detail;

cudaError_t report(const CudaError& e) {
  ThreadState& t = this_thread();
  // "Not ready" is an answer, not an error: the real runtime does not record it.
  if (e.code() != cudaErrorNotReady) t.last_error = e.code();
  t.last_message = e.what();
  if (e.code() != cudaErrorNotReady && e.code() != cudaErrorMemoryAllocation)
    std::fprintf(stderr, "simulated device: %s\n", e.what());
  return e.code();
}

std::string last_message() { return this_thread().last_message; }

namespace detail {

cudaError_t bad_address_code() {
  return this_thread().in_device_work ? cudaErrorIllegalAddress : cudaErrorInvalidValue;
}

}  // namespace detail

namespace {

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;  // as the real runtime's cudaGetErrorString
};

constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* find_error(cudaError_t code) {
  for (const ErrorText& e : kErrors)
    if (e.code == code) return &e;
  return nullptr;
}

}  // namespace
}  // namespace mt::sim

using namespace mt::sim;
using namespace mt::sim::detail;

// The last error of the calling thread, cleared by reading it; a sticky error (a failure inside
// device work) is never cleared, as on the hardware.
cudaError_t cudaGetLastError(void) {
  return api(
      [](Device& d) {
        if (d.sticky != cudaSuccess) return d.sticky;
        const cudaError_t e = this_thread().last_error;
        this_thread().last_error = cudaSuccess;
        return e;
      },
      false);
}

cudaError_t cudaPeekAtLastError(void) {
  return api([](Device& d) { return d.sticky != cudaSuccess ? d.sticky : this_thread().last_error; }, false);
}

const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* e = find_error(error);
  return e ? e->text : "unrecognized error code";
}

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* e = find_error(error);
  return e ? e->name : "unrecognized error code";
}
