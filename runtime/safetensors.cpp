#include "runtime/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/check.h"

namespace mt {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is copied without byte swapping");

namespace {

using json = nlohmann::json;

// The format caps the header at 100 MB; a larger length field means a corrupt or foreign file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// Header padding: the data buffer starts on an 8-byte boundary, so 8-byte elements stay aligned.
constexpr size_t kHeaderAlign = 8;

// How a dtype is stored in the file, which can differ from what it becomes in memory (I64 -> i32).
struct FileDType {
  DType dtype;
  size_t bytes;  // element size in the file
};

bool parse_file_dtype(const std::string& s, FileDType* out) {
  if (s == "F32") *out = {DType::f32, 4};
  else if (s == "BF16") *out = {DType::bf16, 2};
  else if (s == "F16") *out = {DType::f16, 2};
  else if (s == "I32") *out = {DType::i32, 4};
  else if (s == "U16") *out = {DType::u16, 2};
  else if (s == "I64") *out = {DType::i32, 8};
  else return false;
  return true;
}

const char* file_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::u16: return "U16";
  }
  return "?";
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// numel of `shape`, or -1 if a dimension is negative or numel * elem_bytes would overflow int64.
int64_t checked_numel(const std::vector<int64_t>& shape, size_t elem_bytes) {
  const int64_t limit = std::numeric_limits<int64_t>::max() / int64_t(elem_bytes);
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > limit / d) return -1;
    n *= d;
  }
  return n;
}

bool is_nonneg_int(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

// One header entry, checked against the format before any data is read.
struct Entry {
  std::string name;
  FileDType ft;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

Entry parse_entry(const std::string& path, const std::string& name, const json& v) {
  const char* p = path.c_str();
  const char* n = name.c_str();
  if (!v.is_object()) fail("%s: header entry for tensor '%s' is not a JSON object", p, n);
  for (const auto& [key, _] : v.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      fail("%s: tensor '%s' has unexpected header field '%s'", p, n, key.c_str());
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(key)) fail("%s: tensor '%s' lacks the header field '%s'", p, n, key);
  }
  Entry e;
  e.name = name;
  const json& dt = v["dtype"];
  if (!dt.is_string()) fail("%s: tensor '%s': dtype is not a string", p, n);
  if (!parse_file_dtype(dt.get<std::string>(), &e.ft))
    fail("%s: tensor '%s' has unsupported dtype '%s' (supported: F32, BF16, F16, I32, I64, U16)", p, n,
         dt.get<std::string>().c_str());
  const json& sh = v["shape"];
  if (!sh.is_array()) fail("%s: tensor '%s': shape is not an array", p, n);
  for (const json& d : sh) {
    if (!is_nonneg_int(d)) fail("%s: tensor '%s': shape %s has an entry that is not a non-negative integer", p, n,
                                sh.dump().c_str());
    e.shape.push_back(d.get<int64_t>());
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !is_nonneg_int(off[0]) || !is_nonneg_int(off[1]))
    fail("%s: tensor '%s': data_offsets must be [begin, end] with non-negative integers, got %s", p, n,
         off.dump().c_str());
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.end < e.begin)
    fail("%s: tensor '%s': data_offsets [%llu, %llu) end before they begin", p, n, (unsigned long long)e.begin,
         (unsigned long long)e.end);
  int64_t numel = checked_numel(e.shape, e.ft.bytes);
  if (numel < 0) fail("%s: tensor '%s': shape %s is too large", p, n, shape_to_string(e.shape).c_str());
  uint64_t need = uint64_t(numel) * e.ft.bytes;
  if (e.end - e.begin != need)
    fail("%s: tensor '%s': data_offsets [%llu, %llu) hold %llu bytes but dtype %s and shape %s need %llu", p, n,
         (unsigned long long)e.begin, (unsigned long long)e.end, (unsigned long long)(e.end - e.begin),
         dt.get<std::string>().c_str(), shape_to_string(e.shape).c_str(), (unsigned long long)need);
  return e;
}

json parse_header(const std::string& path, const std::string& text) {
  // Detect duplicate top-level names, which a JSON parser would otherwise silently merge.
  std::set<std::string> seen;
  std::string dup;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth == 1 && ev == json::parse_event_t::key && !seen.insert(parsed.get<std::string>()).second)
      dup = parsed.get<std::string>();
    return true;
  };
  json h;
  try {
    h = json::parse(text, cb);
  } catch (const json::exception& e) {
    fail("%s: malformed JSON header (%s)", path.c_str(), e.what());
  }
  if (!dup.empty()) fail("%s: header names '%s' more than once", path.c_str(), dup.c_str());
  if (!h.is_object()) fail("%s: header is not a JSON object", path.c_str());
  return h;
}

// Reads exactly `n` bytes or fails naming the file.
void read_exact(std::ifstream& f, void* dst, uint64_t n, const std::string& path) {
  f.read(static_cast<char*>(dst), std::streamsize(n));
  if (uint64_t(f.gcount()) != n)
    fail("%s: truncated: read %llu of %llu bytes", path.c_str(), (unsigned long long)f.gcount(),
         (unsigned long long)n);
}

void write_all(int fd, const void* src, size_t n, const std::string& tmp) {
  const char* p = static_cast<const char*>(src);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail("%s: write failed (%s)", tmp.c_str(), std::strerror(err));
    }
    p += w;
    n -= size_t(w);
  }
}

}  // namespace

int64_t SafeTensor::numel() const { return checked_numel(shape, 1); }

std::string SafeTensor::shape_str() const { return shape_to_string(shape); }

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  namespace fs = std::filesystem;
  const char* p = path.c_str();
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("%s: no such file", p);
  if (fs::is_directory(path, ec)) fail("%s: is a directory, not a safetensors file", p);
  const uint64_t size = fs::file_size(path, ec);
  if (ec) fail("%s: cannot determine the file size (%s)", p, ec.message().c_str());
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("%s: cannot open (%s)", p, std::strerror(errno));
  if (size < 8) fail("%s: truncated: %llu bytes, less than the 8-byte header length", p, (unsigned long long)size);

  uint64_t header_len = 0;
  read_exact(f, &header_len, 8, path);
  if (header_len > size - 8)
    fail("%s: header length %llu exceeds the %llu bytes that follow it (truncated or not a safetensors file)", p,
         (unsigned long long)header_len, (unsigned long long)(size - 8));
  if (header_len > kMaxHeaderBytes)
    fail("%s: header length %llu exceeds the format's limit of %llu bytes", p, (unsigned long long)header_len,
         (unsigned long long)kMaxHeaderBytes);
  std::string text(header_len, '\0');
  read_exact(f, text.data(), header_len, path);
  const json h = parse_header(path, text);
  const uint64_t buffer_bytes = size - 8 - header_len;

  SafetensorsFile out;
  out.path_ = path;
  std::vector<Entry> entries;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("%s: __metadata__ is not a JSON object", p);
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) fail("%s: __metadata__ value for '%s' is not a string", p, k.c_str());
        out.metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    Entry e = parse_entry(path, name, v);
    if (e.end > buffer_bytes)
      fail("%s: tensor '%s': data_offsets [%llu, %llu) out of range of the %llu-byte data buffer", p, name.c_str(),
           (unsigned long long)e.begin, (unsigned long long)e.end, (unsigned long long)buffer_bytes);
    entries.push_back(std::move(e));
  }

  // The buffer must be tiled exactly: sorted by offset, each tensor starts where the previous ends.
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < pos)
      fail("%s: tensors '%s' and '%s' overlap (data_offsets begin %llu before %llu)", p, prev->name.c_str(),
           e.name.c_str(), (unsigned long long)e.begin, (unsigned long long)pos);
    if (e.begin > pos)
      fail("%s: bytes [%llu, %llu) of the data buffer belong to no tensor (before '%s')", p,
           (unsigned long long)pos, (unsigned long long)e.begin, e.name.c_str());
    pos = e.end;
    prev = &e;
  }
  if (pos != buffer_bytes)
    fail("%s: the data buffer has %llu bytes but the tensors cover only %llu", p, (unsigned long long)buffer_bytes,
         (unsigned long long)pos);

  // Entries are contiguous from the start of the buffer, so the data is read sequentially.
  for (const Entry& e : entries) {
    SafeTensor t;
    t.name = e.name;
    t.dtype = e.ft.dtype;
    t.shape = e.shape;
    const uint64_t n = e.end - e.begin;
    if (e.ft.bytes == 8) {  // I64 narrowed to i32
      std::vector<int64_t> wide(n / 8);
      read_exact(f, wide.data(), n, path);
      t.data.resize(wide.size() * 4);
      int32_t* dst = reinterpret_cast<int32_t*>(t.data.data());
      for (size_t i = 0; i < wide.size(); i++) {
        if (wide[i] < std::numeric_limits<int32_t>::min() || wide[i] > std::numeric_limits<int32_t>::max())
          fail("%s: tensor '%s' (I64) holds %lld at index %zu, which does not fit in int32", p, e.name.c_str(),
               (long long)wide[i], i);
        dst[i] = int32_t(wide[i]);
      }
    } else {
      t.data.resize(n);
      read_exact(f, t.data.data(), n, path);
    }
    out.index_[t.name] = out.tensors_.size();
    out.tensors_.push_back(std::move(t));
  }
  return out;
}

const SafeTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafeTensor& SafetensorsFile::get(const std::string& name) const {
  const SafeTensor* t = find(name);
  if (!t) fail("%s: no tensor named '%s'", path_.c_str(), name.c_str());
  return *t;
}

std::vector<float> SafetensorsFile::to_f32(const std::string& name) const {
  const SafeTensor& t = get(name);
  const size_t n = size_t(t.numel());
  std::vector<float> out(n);
  if (t.dtype == DType::f32) {
    std::memcpy(out.data(), t.data.data(), n * 4);
    return out;
  }
  if (t.dtype != DType::bf16 && t.dtype != DType::f16)
    fail("%s: tensor '%s' is %s, not a floating-point type", path_.c_str(), name.c_str(), file_dtype_name(t.dtype));
  for (size_t i = 0; i < n; i++) {
    uint16_t h;
    std::memcpy(&h, t.data.data() + 2 * i, 2);
    out[i] = t.dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
  return out;
}

std::vector<int32_t> SafetensorsFile::to_i32(const std::string& name) const {
  const SafeTensor& t = get(name);
  if (t.dtype != DType::i32)
    fail("%s: tensor '%s' is %s, not I32 or I64", path_.c_str(), name.c_str(), file_dtype_name(t.dtype));
  std::vector<int32_t> out(size_t(t.numel()));
  std::memcpy(out.data(), t.data.data(), out.size() * 4);
  return out;
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data) {
  if (name.empty() || name == "__metadata__") fail("safetensors: invalid tensor name '%s'", name.c_str());
  for (const SafeTensor& t : tensors_) {
    if (t.name == name) fail("safetensors: tensor '%s' added twice", name.c_str());
  }
  const int64_t numel = checked_numel(shape, dtype_size(dtype));
  if (numel < 0) fail("safetensors: tensor '%s' has invalid shape %s", name.c_str(), shape_to_string(shape).c_str());
  SafeTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(size_t(numel) * dtype_size(dtype));
  if (!t.data.empty()) {
    MT_CHECK(data != nullptr, "tensor '%s': null data for %zu bytes", name.c_str(), t.data.size());
    std::memcpy(t.data.data(), data, t.data.size());
  }
  tensors_.push_back(std::move(t));
}

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, const float* data,
                                DType stored) {
  if (stored == DType::f32) return add(name, DType::f32, std::move(shape), data);
  if (stored != DType::bf16 && stored != DType::f16)
    fail("safetensors: tensor '%s': cannot store fp32 values as %s", name.c_str(), dtype_name(stored));
  const int64_t numel = checked_numel(shape, 2);
  if (numel < 0) fail("safetensors: tensor '%s' has invalid shape %s", name.c_str(), shape_to_string(shape).c_str());
  std::vector<uint16_t> h(static_cast<size_t>(numel));
  for (size_t i = 0; i < h.size(); i++) h[i] = stored == DType::bf16 ? f32_to_bf16(data[i]) : f32_to_f16(data[i]);
  add(name, stored, std::move(shape), h.data());
}

void SafetensorsWriter::add_i32(const std::string& name, std::vector<int64_t> shape, const int32_t* data) {
  add(name, DType::i32, std::move(shape), data);
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

void SafetensorsWriter::write(const std::string& path) const {
  json h = json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const SafeTensor& t : tensors_) {
    h[t.name] = {{"dtype", file_dtype_name(t.dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = h.dump();
  text.append((kHeaderAlign - text.size() % kHeaderAlign) % kHeaderAlign, ' ');
  const uint64_t header_len = text.size();

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("%s: cannot create (%s)", tmp.c_str(), std::strerror(errno));
  write_all(fd, &header_len, 8, tmp);
  write_all(fd, text.data(), text.size(), tmp);
  for (const SafeTensor& t : tensors_) write_all(fd, t.data.data(), t.data.size(), tmp);
  const bool synced = ::fsync(fd) == 0;
  int err = errno;
  const bool closed = ::close(fd) == 0;
  if (synced && !closed) err = errno;
  if (!synced || !closed) {
    ::unlink(tmp.c_str());
    fail("%s: cannot flush to disk (%s)", tmp.c_str(), std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    fail("%s: cannot rename %s into place (%s)", path.c_str(), tmp.c_str(), std::strerror(err));
  }
  // Make the rename itself durable: fsync the directory that holds the new entry.
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace mt
