// One spelling for every kernel launch of the CUDA backend, so that the same launcher runs on a GPU
// and on the simulated device (sim/, MT_CUDA_SIM=ON):
//
//   MT_LAUNCH(shape, stream, kernel)(args...);
//
// Under nvcc it is `kernel<<<shape.grid, shape.block, shape.smem, stream>>>(args...)`, token for token.
// Under the simulated build (the .cu files compiled as C++ by the host compiler) it checks the launch
// as the hardware would (mt::sim::check_launch: block and grid limits, the kernel's shared-memory
// opt-in), checks that every non-null pointer argument is device memory (naming the kernel and the
// argument's index), and queues the whole grid on `stream`, run on the warp emulator
// (warp_emulation.h) with the launch's dynamic shared memory when something waits for the stream.
//
// The kernel comes last and the arguments after the macro, not inside it, because a kernel is often a
// template (`flash_fwd_kernel<D, ND>`) whose commas would split a macro argument. Under the sim the
// kernel must name one function (a template with its arguments written out), since its address keys
// the per-kernel shared-memory opt-in and its parameter types convert the arguments, as at a launch.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace mt::cuda {

// What a launcher passes in <<<grid, block, smem>>>. Each kernel header computes it in one function
// that the launcher and the emulator test both call, so the test runs the launcher's shape.
struct LaunchShape {
  dim3 grid, block;
  size_t smem = 0;
};

}  // namespace mt::cuda

#if defined(__CUDACC__)

#define MT_LAUNCH(shape, stream, ...) __VA_ARGS__<<<(shape).grid, (shape).block, (shape).smem, (stream)>>>

#elif defined(MT_CUDA_SIM)

#include <string>
#include <type_traits>

#include "kernels/cuda/warp_emulation.h"
#include "sim/sim.h"

namespace mt::cuda {

// A launch on the simulated device of a kernel with parameters P...: the call operator takes the
// kernel's own parameter types, so arguments convert (and braced initialisers work) as at a launch.
// Failures are those of a failed launch: the thread's last error, read by MT_CUDA_CHECK_LAUNCH.
template <class... P>
class SimulatedLaunch {
 public:
  SimulatedLaunch(const char* name, const LaunchShape& shape, cudaStream_t stream, void (*kernel)(P...))
      : name_(name), shape_(shape), stream_(stream), kernel_(kernel) {}

  void operator()(P... args) const {
    if (::mt::sim::check_launch(name_, shape_.grid, shape_.block, shape_.smem, reinterpret_cast<const void*>(kernel_)) !=
        cudaSuccess)
      return;
    try {
      size_t index = 0;
      (require_device_argument(args, index++), ...);
      // enqueue runs the work inside a DeviceAccess scope: device memory is open to the emulated grid.
      ::mt::sim::enqueue(stream_, name_, [shape = shape_, kernel = kernel_, args...] {
        ::mt::cuda::emu::launch(shape.grid, shape.block, shape.smem, kernel, args...);
      });
    } catch (const ::mt::sim::CudaError& e) {
      ::mt::sim::report(e);
    }
  }

 private:
  // A pointer that the kernel dereferences must be device memory; null is an absent optional tensor.
  // Pointers inside struct arguments are not seen here; the emulated grid's accesses still are.
  template <class A>
  void require_device_argument(const A& a, size_t index) const {
    if constexpr (std::is_pointer_v<A>) {
      if (a != nullptr) ::mt::sim::require_device(a, 0, name_, ("argument " + std::to_string(index)).c_str());
    }
  }

  const char* name_;
  LaunchShape shape_;
  cudaStream_t stream_;
  void (*kernel_)(P...);
};

template <class... P>
SimulatedLaunch(const char*, const LaunchShape&, cudaStream_t, void (*)(P...)) -> SimulatedLaunch<P...>;

}  // namespace mt::cuda

#define MT_LAUNCH(shape, stream, ...) ::mt::cuda::SimulatedLaunch(#__VA_ARGS__, (shape), (stream), __VA_ARGS__)

#endif
