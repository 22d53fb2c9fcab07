// Tensor: a non-owning view (pointer, shape, dtype, device). Storage belongs to an Arena or a ParamStore.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "runtime/dtype.h"

namespace mt {

enum class Device : uint8_t { cpu, cuda };
const char* device_name(Device d);
Device device_from_name(const std::string& s);  // "cpu" | "cuda"; throws naming the value

struct Tensor {
  static constexpr int kMaxDims = 4;
  void* ptr = nullptr;
  std::array<int64_t, kMaxDims> shape{};
  int ndim = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu;

  Tensor() = default;
  Tensor(void* p, std::initializer_list<int64_t> dims, DType t = DType::f32, Device d = Device::cpu);

  int64_t numel() const;
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[size_t(i)]; }
  float* f32() const;      // checks dtype == f32
  int32_t* i32() const;    // checks dtype == i32
  std::string shape_str() const;  // "(4, 256, 768)"
};

}  // namespace mt
