// The one CUB call the CUDA backend makes (encoder.cu's stable sort of (token, row) pairs), declared
// for the host build of the simulated device: CUB's own headers hold device code that only nvcc
// compiles. Declared, not yet defined: a program that calls it does not link until the sim has its
// stand-in (a stable sort of the pairs by key, as CUB's radix sort orders them).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

namespace cub {

struct DeviceRadixSort {
  // CUB's signature (cub/device/device_radix_sort.cuh): with d_temp_storage null it only sets
  // temp_storage_bytes.
  template <class KeyT, class ValueT, class NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const KeyT* d_keys_in,
                               KeyT* d_keys_out, const ValueT* d_values_in, ValueT* d_values_out, NumItemsT num_items,
                               int begin_bit = 0, int end_bit = int(sizeof(KeyT) * 8), cudaStream_t stream = 0);
};

}  // namespace cub
