// CUB's DeviceRadixSort::SortPairs for the simulated device (declared in sim/cub_radix_sort.h): the
// one CUB call the CUDA backend makes. Like CUB's, the sort is stable (pairs with equal keys keep
// their input order) and orders by the key bits [begin_bit, end_bit) only; the first call, with no
// temporary storage, only reports how much it needs. The sort itself is queued on the stream and runs
// in its order, on device memory that the stand-in checks first.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "sim/cub_radix_sort.h"
#include "sim/sim.h"
#include "sim/state.h"

namespace cub {
namespace {

// What the stand-in asks for: enough to hold the pairs' order, as CUB's double buffers would (CUB's
// own figure depends on its tuning; callers must only pass back what they were told).
template <class KeyT, class ValueT>
size_t temp_bytes_for(size_t n) {
  return std::max<size_t>(256, n * (sizeof(KeyT) + sizeof(ValueT)));
}

}  // namespace

template <class KeyT, class ValueT, class NumItemsT>
cudaError_t DeviceRadixSort::SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const KeyT* d_keys_in,
                                       KeyT* d_keys_out, const ValueT* d_values_in, ValueT* d_values_out,
                                       NumItemsT num_items, int begin_bit, int end_bit, cudaStream_t stream) {
  using namespace mt::sim;
  using detail::format;
  static_assert(std::is_unsigned_v<KeyT>, "the stand-in sorts unsigned keys (the only kind the project uses)");
  constexpr int kBits = int(sizeof(KeyT) * 8);
  const char* call = "cub::DeviceRadixSort::SortPairs";
  const size_t need = temp_bytes_for<KeyT, ValueT>(num_items > 0 ? size_t(num_items) : 0);
  try {
    if (num_items < 0) throw CudaError(cudaErrorInvalidValue, format("%s: num_items %lld < 0", call, (long long)num_items));
    if (begin_bit < 0 || end_bit > kBits || begin_bit >= end_bit)
      throw CudaError(cudaErrorInvalidValue,
                      format("%s: key bits [%d, %d) outside [0, %d) or empty", call, begin_bit, end_bit, kBits));
    if (!d_temp_storage) {
      temp_storage_bytes = need;
      return cudaSuccess;
    }
    if (temp_storage_bytes < need)
      throw CudaError(cudaErrorInvalidValue, format("%s: temp_storage_bytes %zu is less than the %zu bytes the size "
                                                    "query reported", call, temp_storage_bytes, need));
    const size_t n = size_t(num_items);
    require_device(d_temp_storage, temp_storage_bytes, call, "d_temp_storage");
    if (n == 0) return cudaSuccess;
    require_device(d_keys_in, n * sizeof(KeyT), call, "d_keys_in");
    require_device(d_keys_out, n * sizeof(KeyT), call, "d_keys_out");
    require_device(d_values_in, n * sizeof(ValueT), call, "d_values_in");
    require_device(d_values_out, n * sizeof(ValueT), call, "d_values_out");
    const KeyT mask = KeyT((end_bit - begin_bit == kBits ? ~KeyT(0) : (KeyT(1) << (end_bit - begin_bit)) - 1)
                           << begin_bit);
    enqueue(stream, call, [=] {
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), size_t(0));
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return (d_keys_in[a] & mask) < (d_keys_in[b] & mask); });
      std::vector<KeyT> keys(n);
      std::vector<ValueT> values(n);
      for (size_t i = 0; i < n; ++i) {
        keys[i] = d_keys_in[order[i]];
        values[i] = d_values_in[order[i]];
      }
      std::copy(keys.begin(), keys.end(), d_keys_out);
      std::copy(values.begin(), values.end(), d_values_out);
    });
    return cudaSuccess;
  } catch (const CudaError& e) {
    return report(e);
  }
}

template cudaError_t DeviceRadixSort::SortPairs<uint32_t, int32_t, int>(void*, size_t&, const uint32_t*, uint32_t*,
                                                                       const int32_t*, int32_t*, int, int, int,
                                                                       cudaStream_t);

}  // namespace cub
