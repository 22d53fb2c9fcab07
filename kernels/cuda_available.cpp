#include "kernels/cuda_available.h"

#ifdef MT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace mt::ops {

std::string cuda_unavailable_reason() {
#ifdef MT_HAVE_CUDA
  if (cuda::device_count() == 0) return "no CUDA device found (cudaGetDeviceCount returned 0)";
  return "";
#else
  return "this build has no CUDA backend; configure with -DMT_CUDA=ON";
#endif
}

}  // namespace mt::ops
