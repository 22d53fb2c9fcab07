// Whether CUDA ops can run in this process, and if not, why: the build has no CUDA backend, or the
// driver reports no device. The trainer, `selftest` and `bench --calibrate device=cuda` ask it before
// touching a GPU, and each prefixes the answer with its own name.
#pragma once
#include <string>

namespace mt::ops {

// Empty when CUDA ops can run here, else one line saying why not. A driver that is present but broken
// throws mt::Error instead (kernels/cuda/device.cu, device_count).
std::string cuda_unavailable_reason();

}  // namespace mt::ops
