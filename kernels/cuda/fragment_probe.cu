// The tensor-core fragment probe on the GPU (fragment_probe_kernels.cuh; expectations in
// fragment_probe.h), for `minitrain selftest`.
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_array.h"
#include "kernels/cuda/fragment_probe.h"
#include "kernels/cuda/fragment_probe_kernels.cuh"
#include "kernels/cuda/storage.cuh"

namespace mt::cuda::fragment_probe {

namespace {

template <class S>
Result run_as() {
  const std::vector<S> a = to_storage<S>(input_a()), b = to_storage<S>(input_b());
  DeviceArray<S> d_a(a), d_b(b);
  DeviceArray<float> c_n(std::vector<float>(kN * kN)), c_k(std::vector<float>(kN * kN));
  DeviceArray<uint32_t> regs(std::vector<uint32_t>(kLanes * kRegsPerLane)),
      copied(std::vector<uint32_t>(kLanes * kCopyWords));
  const LaunchShape one_warp{dim3(1), dim3(kLanes), kSmemBytes};
  MT_LAUNCH(one_warp, 0, probe_kernel<dev_t<S>>)(
      dev_ptr(d_a.get()), dev_ptr(d_b.get()), c_n.get(), c_k.get(), regs.get(), copied.get());
  MT_CUDA_CHECK_LAUNCH();
  Result r = expectations(bit_patterns(a), bit_patterns(b));
  r.c_nmajor = c_n.host();
  r.c_kmajor = c_k.host();
  r.regs = regs.host();
  r.copied = copied.host();
  return r;
}

}  // namespace

bool supported() {
  int dev = 0, major = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major >= 8;
}

Result run(DType t) {
  MT_CHECK(supported(), "fragment probe: mma.sync m16n8k16 and cp.async need compute capability 8.0 or later");
  MT_CHECK(t == DType::bf16 || t == DType::f16, "fragment probe: bf16 or f16, not %s", dtype_name(t));
  return t == DType::bf16 ? run_as<bf16>() : run_as<f16>();
}

}  // namespace mt::cuda::fragment_probe
