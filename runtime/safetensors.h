// Reading and writing the safetensors format, the interchange format for weights and fixtures.
//
// Layout of a file (all integers little-endian):
//   u64  N                 length of the header in bytes
//   N    header            JSON object: name -> {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
//                          plus an optional "__metadata__": {string: string}; may end in spaces (padding)
//   ...  byte buffer       the raw tensors, row-major; offsets are relative to its first byte
// The reader follows the format's rules strictly: every byte of the buffer belongs to exactly one
// tensor (no overlaps, no holes, nothing after the last tensor), and end - begin equals
// numel x element size. Every violation is reported by mt::fail with the file name and the problem.
//
// Element types: F32, BF16, F16, I32 and U16 map to mt::DType one to one. I64 (what PyTorch uses for
// token ids) is accepted on read and narrowed to I32, failing if a value does not fit. Other types
// (F64, I8, BOOL, ...) are rejected by name.
//
// The host is assumed little-endian, as the format is (checked at compile time).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/dtype.h"

namespace mt {

struct SafeTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // empty for a scalar
  std::vector<uint8_t> data;   // numel() * dtype_size(dtype) bytes, row-major, little-endian

  int64_t numel() const;
  std::string shape_str() const;  // "(2, 12, 97)"
};

class SafetensorsFile {
 public:
  // Reads the whole file into memory; fails (mt::Error) naming `path` and what is wrong with it.
  static SafetensorsFile read(const std::string& path);

  const std::string& path() const { return path_; }
  // Tensors in the order their bytes appear in the file.
  const std::vector<SafeTensor>& tensors() const { return tensors_; }
  // The "__metadata__" map (empty if the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  const SafeTensor* find(const std::string& name) const;  // nullptr if absent
  const SafeTensor& get(const std::string& name) const;   // fails naming the file and the tensor
  // The tensor's values as fp32: F32 as is, BF16/F16 widened exactly. Fails for integer types.
  std::vector<float> to_f32(const std::string& name) const;
  // The tensor's values as int32: I32 (and I64, already narrowed on read). Fails for other types.
  std::vector<int32_t> to_i32(const std::string& name) const;

 private:
  std::string path_;
  std::vector<SafeTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors and metadata, then writes them in one go. add() copies the data, so the writer
// holds a consistent snapshot even if the caller's buffers change before write().
class SafetensorsWriter {
 public:
  // `data` holds numel(shape) * dtype_size(dtype) bytes. Names must be unique and not "__metadata__".
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data);
  // fp32 values stored as `stored` (f32, bf16 or f16; rounded to nearest even).
  void add_f32(const std::string& name, std::vector<int64_t> shape, const float* data,
               DType stored = DType::f32);
  void add_i32(const std::string& name, std::vector<int64_t> shape, const int32_t* data);
  void set_metadata(const std::string& key, const std::string& value);

  // Writes `path`.tmp, fsyncs it, renames it over `path` and fsyncs the directory: a reader sees
  // either the old file or the complete new one, never a half-written file.
  void write(const std::string& path) const;

 private:
  std::vector<SafeTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mt
