// Host-side helpers for code that checks the CUDA backend against the CPU one (the selftest and the
// GPU tests): a device copy of a host vector that frees itself, and whole-vector conversions between
// fp32 and a storage type. Plain C++ (no CUDA headers), like cuda_ops.h.
#pragma once
#include <cstddef>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "runtime/check.h"
#include "runtime/storage.h"

namespace mt::cuda {

// A device copy of a host vector, freed on scope exit.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    p_ = static_cast<T*>(device_alloc(n_ * sizeof(T)));
    copy_to_device(p_, host.data(), n_ * sizeof(T));
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  // A failed free is not thrown from a destructor: whatever broke the device is reported by the
  // caller's next checked call.
  ~DeviceArray() {
    try {
      device_free(p_);
    } catch (const Error&) {
    }
  }
  T* get() const { return p_; }
  // The contents, after all queued work is done.
  std::vector<T> host() const {
    std::vector<T> v(n_);
    synchronize();
    copy_to_host(v.data(), p_, n_ * sizeof(T));
    return v;
  }

 private:
  size_t n_;
  T* p_ = nullptr;
};

// Values rounded to storage type S (round to nearest even), and S values loaded back into fp32.
template <class S>
std::vector<S> to_storage(const std::vector<float>& v) {
  std::vector<S> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = ::mt::store_as<S>(v[i]);  // the host rounding (runtime/storage.h)
  return out;
}
template <class S>
std::vector<float> to_floats(const std::vector<S>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); i++) out[i] = load(v[i]);
  return out;
}

}  // namespace mt::cuda
