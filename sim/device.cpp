// The one simulated GPU, an H200: its properties and attributes, device selection and reset, and the
// launch limits that kernels' shapes are checked against (check_launch).
#include <cstring>

#include "sim/state.h"

// The symbols defined here are the CUDA 13 runtime's (CUDA 12's headers map cudaGetDeviceProperties to
// a _v2 symbol, with another cudaDeviceProp).
static_assert(CUDART_VERSION >= 13000, "the simulated device stands in for the CUDA 13 runtime");

namespace mt::sim {
namespace detail {
namespace {

constexpr int kSMs = 132;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDim[3] = {1024, 1024, 64};
constexpr unsigned kMaxGridDim[3] = {2147483647u, 65535, 65535};
constexpr int kSharedPerSM = 233472;  // 228 KiB
constexpr int kL2Bytes = 52428800;

// The attributes the sim answers; any other fails naming itself.
bool attribute(cudaDeviceAttr attr, int& v) {
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: v = kMaxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: v = int(kMaxBlockDim[0]); break;
    case cudaDevAttrMaxBlockDimY: v = int(kMaxBlockDim[1]); break;
    case cudaDevAttrMaxBlockDimZ: v = int(kMaxBlockDim[2]); break;
    case cudaDevAttrMaxGridDimX: v = int(kMaxGridDim[0]); break;
    case cudaDevAttrMaxGridDimY: v = int(kMaxGridDim[1]); break;
    case cudaDevAttrMaxGridDimZ: v = int(kMaxGridDim[2]); break;
    case cudaDevAttrMaxSharedMemoryPerBlock: v = int(kSharedDefault); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: v = int(kSharedOptin); break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: v = kSharedPerSM; break;
    case cudaDevAttrReservedSharedMemoryPerBlock: v = 1024; break;
    case cudaDevAttrTotalConstantMemory: v = 65536; break;
    case cudaDevAttrWarpSize: v = 32; break;
    case cudaDevAttrMaxRegistersPerBlock: v = 65536; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: v = 65536; break;
    case cudaDevAttrMultiProcessorCount: v = kSMs; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: v = 2048; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: v = 32; break;
    case cudaDevAttrComputeCapabilityMajor: v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: v = 0; break;
    case cudaDevAttrL2CacheSize: v = kL2Bytes; break;
    case cudaDevAttrGlobalMemoryBusWidth: v = 6144; break;
    case cudaDevAttrConcurrentKernels: v = 1; break;
    case cudaDevAttrUnifiedAddressing: v = 1; break;
    case cudaDevAttrIntegrated: v = 0; break;
    case cudaDevAttrCooperativeLaunch: v = 1; break;
    case cudaDevAttrMemoryPoolsSupported: v = 1; break;
    default: return false;
  }
  return true;
}

void check_device(int device, const char* call) {
  if (device != 0)
    throw CudaError(cudaErrorInvalidDevice,
                    format("%s: device %d (the simulated machine has one device, 0)", call, device));
}

}  // namespace
}  // namespace detail

cudaError_t check_launch(const char* kernel, dim3 grid, dim3 block, size_t dyn_smem, const void* func) {
  using namespace detail;
  return api([&](Device& d) {
    auto fail = [&](cudaError_t code, const std::string& limit) {
      throw CudaError(code, format("launch of %s<<<(%u, %u, %u), (%u, %u, %u), %zu>>>: %s",
                                   kernel ? kernel : "a kernel", grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                   dyn_smem, limit.c_str()));
    };
    const unsigned b[3] = {block.x, block.y, block.z}, g[3] = {grid.x, grid.y, grid.z};
    for (int i = 0; i < 3; i++) {
      if (b[i] == 0 || g[i] == 0) fail(cudaErrorInvalidConfiguration, "a dimension of 0");
      if (b[i] > kMaxBlockDim[i])
        fail(cudaErrorInvalidConfiguration, format("block.%c = %u, above the limit of %u (1024 x 1024 x 64)", "xyz"[i],
                                                   b[i], kMaxBlockDim[i]));
      if (g[i] > kMaxGridDim[i])
        fail(cudaErrorInvalidConfiguration,
             format("grid.%c = %u, above the limit of %u", "xyz"[i], g[i], kMaxGridDim[i]));
    }
    const uint64_t threads = uint64_t(block.x) * block.y * block.z;
    if (threads > uint64_t(kMaxThreadsPerBlock))
      fail(cudaErrorInvalidConfiguration,
           format("%llu threads per block, above the limit of %d", (unsigned long long)threads, kMaxThreadsPerBlock));
    auto raised = d.max_dynamic_shared.find(func);
    const size_t limit = raised == d.max_dynamic_shared.end() ? kSharedDefault : raised->second;
    if (dyn_smem > limit)
      fail(cudaErrorInvalidValue,
           raised == d.max_dynamic_shared.end()
               ? format("%zu bytes of dynamic shared memory, above the default limit of %zu (raise it with "
                        "cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "
                        "to at most %zu)",
                        dyn_smem, kSharedDefault, kSharedOptin)
               : format("%zu bytes of dynamic shared memory, above the %zu that cudaFuncSetAttribute allowed it",
                        dyn_smem, limit));
    return cudaSuccess;
  });
}

}  // namespace mt::sim

using namespace mt::sim;
using namespace mt::sim::detail;

cudaError_t cudaGetDeviceCount(int* count) {
  return api(
      [&](Device&) {
        if (!count) throw CudaError(cudaErrorInvalidValue, "cudaGetDeviceCount: count is null");
        *count = 1;
        return cudaSuccess;
      },
      false);
}

cudaError_t cudaSetDevice(int device) {
  return api([&](Device&) {
    check_device(device, "cudaSetDevice");
    return cudaSuccess;
  });
}

cudaError_t cudaGetDevice(int* device) {
  return api([&](Device&) {
    if (!device) throw CudaError(cudaErrorInvalidValue, "cudaGetDevice: device is null");
    *device = 0;
    return cudaSuccess;
  });
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  return api([&](Device&) {
    if (!prop) throw CudaError(cudaErrorInvalidValue, "cudaGetDeviceProperties: prop is null");
    check_device(device, "cudaGetDeviceProperties");
    std::memset(prop, 0, sizeof *prop);
    std::strncpy(prop->name, "NVIDIA H200 (simulated)", sizeof prop->name - 1);
    prop->totalGlobalMem = kTotalMemory;
    prop->sharedMemPerBlock = kSharedDefault;
    prop->sharedMemPerBlockOptin = kSharedOptin;
    prop->sharedMemPerMultiprocessor = size_t(kSharedPerSM);
    prop->reservedSharedMemPerBlock = 1024;
    prop->regsPerBlock = 65536;
    prop->regsPerMultiprocessor = 65536;
    prop->warpSize = 32;
    prop->memPitch = 2147483647;
    prop->maxThreadsPerBlock = kMaxThreadsPerBlock;
    for (int i = 0; i < 3; i++) {
      prop->maxThreadsDim[i] = int(kMaxBlockDim[i]);
      prop->maxGridSize[i] = int(kMaxGridDim[i]);
    }
    prop->totalConstMem = 65536;
    prop->major = 9;
    prop->minor = 0;
    prop->textureAlignment = 512;
    prop->texturePitchAlignment = 32;
    prop->multiProcessorCount = kSMs;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->maxBlocksPerMultiProcessor = 32;
    prop->l2CacheSize = kL2Bytes;
    prop->memoryBusWidth = 6144;
    prop->canMapHostMemory = 1;
    prop->concurrentKernels = 1;
    prop->unifiedAddressing = 1;
    prop->managedMemory = 1;
    prop->cooperativeLaunch = 1;
    prop->memoryPoolsSupported = 1;
    prop->clusterLaunch = 1;
    return cudaSuccess;
  });
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  return api([&](Device&) {
    if (!value) throw CudaError(cudaErrorInvalidValue, "cudaDeviceGetAttribute: value is null");
    check_device(device, "cudaDeviceGetAttribute");
    if (!attribute(attr, *value))
      throw CudaError(cudaErrorInvalidValue, format("cudaDeviceGetAttribute: attribute %d is not simulated "
                                                    "(add it to sim/device.cpp)",
                                                    int(attr)));
    return cudaSuccess;
  });
}

// Drops all queued work, streams, events and allocations (pinned ones too), and the sticky error.
cudaError_t cudaDeviceReset(void) {
  return api(
      [](Device& d) {
        drop_all_work(d);
        d.streams.clear();
        d.per_thread.clear();
        d.events.clear();
        d.legacy = std::make_shared<CUstream_st>();
        d.legacy->legacy = true;
        release_all(d);
        d.sticky = cudaSuccess;
        d.max_dynamic_shared.clear();
        d.pool = CUmemPoolHandle_st{};
        this_thread().last_error = cudaSuccess;
        this_thread().last_message.clear();
        return cudaSuccess;
      },
      false);
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  return api([&](Device& d) {
    if (!func) throw CudaError(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute: func is null");
    switch (attr) {
      case cudaFuncAttributeMaxDynamicSharedMemorySize:
        if (value < 0 || size_t(value) > kSharedOptin)
          throw CudaError(cudaErrorInvalidValue,
                          format("cudaFuncSetAttribute: %d bytes of dynamic shared memory for %p, the device allows "
                                 "at most %zu",
                                 value, func, kSharedOptin));
        d.max_dynamic_shared[func] = size_t(value);
        break;
      case cudaFuncAttributePreferredSharedMemoryCarveout:
        if (value < -1 || value > 100)
          throw CudaError(cudaErrorInvalidValue,
                          format("cudaFuncSetAttribute: carveout %d (a percentage, or -1)", value));
        break;  // a performance hint: nothing to simulate
      default:
        throw CudaError(cudaErrorInvalidValue,
                        format("cudaFuncSetAttribute: attribute %d is not simulated", int(attr)));
    }
    return cudaSuccess;
  });
}
