#include "runtime/tensor.h"

#include "runtime/check.h"

namespace mt {

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

Device device_from_name(const std::string& s) {
  if (s == "cpu") return Device::cpu;
  if (s == "cuda") return Device::cuda;
  fail("unknown device '%s' (expected cpu or cuda)", s.c_str());
}

Tensor::Tensor(void* p, std::initializer_list<int64_t> dims, DType t, Device d) : ptr(p), dtype(t), device(d) {
  MT_CHECK(dims.size() <= kMaxDims, "tensor of %zu dims (max %d)", dims.size(), kMaxDims);
  for (int64_t x : dims) {
    MT_CHECK(x >= 0, "negative tensor dimension %lld", (long long)x);
    shape[size_t(ndim++)] = x;
  }
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[size_t(i)];
  return n;
}

float* Tensor::f32() const {
  MT_CHECK(dtype == DType::f32, "tensor is %s, not f32", dtype_name(dtype));
  return static_cast<float*>(ptr);
}

int32_t* Tensor::i32() const {
  MT_CHECK(dtype == DType::i32, "tensor is %s, not i32", dtype_name(dtype));
  return static_cast<int32_t*>(ptr);
}

std::string Tensor::shape_str() const {
  std::string s = "(";
  for (int i = 0; i < ndim; i++) s += (i ? ", " : "") + std::to_string(shape[size_t(i)]);
  return s + ")";
}

}  // namespace mt
