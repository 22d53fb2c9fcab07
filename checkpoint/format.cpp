#include "checkpoint/format.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "checkpoint/crc32c.h"
#include "checkpoint/fsio.h"
#include "runtime/check.h"

namespace mt::checkpoint {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

constexpr char kMagic[8] = {'M', 'T', 'C', 'K', 'P', 'T', '\r', '\n'};

const json& field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object()) fail("%s: expected a JSON object", where.c_str());
  auto it = j.find(key);
  if (it == j.end()) fail("%s: missing field '%s'", where.c_str(), key);
  return *it;
}

template <class T>
T get(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  try {
    if constexpr (std::is_unsigned_v<T>) {
      if (!v.is_number_unsigned()) throw std::invalid_argument("not an unsigned integer");
    } else if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer()) throw std::invalid_argument("not an integer");
    }
    return v.get<T>();
  } catch (const std::exception& e) {
    fail("%s: field '%s' has the wrong type (%s): %s", where.c_str(), key, e.what(), v.dump().c_str());
  }
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : global_shape) n *= d;
  return n;
}

std::string encode_header(int rank, int world_size, int64_t step) {
  std::string h(kHeaderBytes, '\0');
  const uint32_t version = kFormatVersion, r = uint32_t(rank), w = uint32_t(world_size);
  std::memcpy(h.data(), kMagic, 8);
  std::memcpy(h.data() + 8, &version, 4);
  std::memcpy(h.data() + 12, &r, 4);
  std::memcpy(h.data() + 16, &w, 4);
  std::memcpy(h.data() + 24, &step, 8);
  return h;
}

void check_header(const void* header, const std::string& path, int rank, int world_size, int64_t step) {
  const char* h = static_cast<const char*>(header);
  if (std::memcmp(h, kMagic, 8) != 0) fail("%s is not a minitrain checkpoint data file (bad magic)", path.c_str());
  uint32_t version, r, w;
  int64_t s;
  std::memcpy(&version, h + 8, 4);
  std::memcpy(&r, h + 12, 4);
  std::memcpy(&w, h + 16, 4);
  std::memcpy(&s, h + 24, 8);
  if (version != uint32_t(kFormatVersion))
    fail("%s: data file format version %u, this build reads version %d", path.c_str(), version, kFormatVersion);
  if (int(r) != rank || int(w) != world_size || s != step)
    fail("%s: header says rank %u of %u at step %lld, the manifest says rank %d of %d at step %lld", path.c_str(), r,
         w, (long long)s, rank, world_size, (long long)step);
}

std::string step_dir_name(int64_t step) { return strfmt("step_%06lld", (long long)step); }

std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  constexpr size_t kPrefix = 5;  // "step_"
  if (name.size() <= kPrefix || name.compare(0, kPrefix, "step_") != 0 || name.size() > kPrefix + 18)
    return std::nullopt;
  int64_t v = 0;
  for (size_t i = kPrefix; i < name.size(); i++) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  // Only the canonical spelling, so that a step names exactly one directory.
  if (name != step_dir_name(v)) return std::nullopt;
  return v;
}

std::string rank_file_name(int rank) { return strfmt("rank_%05d.bin", rank); }
std::string rank_table_name(int rank) { return strfmt("rank_%05d.json", rank); }
std::string rank_failed_name(int rank) { return strfmt("rank_%05d.failed", rank); }

ParamBox PieceSpan::box(const std::vector<int64_t>& shape) const {
  if (!is_box()) return ParamBox{shape, std::vector<int64_t>(shape.size(), 0), shape};
  return ParamBox{shape, box_offset, box_extent};
}

std::string PieceSpan::problem(const std::vector<int64_t>& shape) const {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (is_box()) {
    if (box_offset.size() != shape.size() || box_extent.size() != shape.size())
      return strfmt("has a box of %zu dimensions; the tensor has %zu", box_extent.size(), shape.size());
    numel = 1;
    for (size_t d = 0; d < shape.size(); d++) {
      if (box_offset[d] < 0 || box_extent[d] <= 0 || box_offset[d] + box_extent[d] > shape[d])
        return strfmt("has a box that leaves the tensor along dimension %zu", d);
      numel *= box_extent[d];
    }
  }
  if (flat_begin < 0 || flat_end < flat_begin || flat_end > numel)
    return strfmt("[%lld, %lld) is not inside the %s (%lld elements)", (long long)flat_begin, (long long)flat_end,
                  is_box() ? "box" : "tensor", (long long)numel);
  return "";
}

ordered_json tensor_to_json(const TensorInfo& t) {
  return {{"name", t.name}, {"shape", t.global_shape}, {"dtype", dtype_name(t.dtype)}};
}

ordered_json file_to_json(const FileRecord& f) {
  ordered_json pieces = ordered_json::array();
  for (const PieceRecord& p : f.pieces) {
    ordered_json j{{"tensor", p.tensor}, {"kind", p.is_box() ? "box" : "flat"}};
    if (p.is_box()) j["box"] = {{"offset", p.box_offset}, {"extent", p.box_extent}};
    j["flat"] = {p.flat_begin, p.flat_end};
    j["offset"] = p.offset;
    j["length"] = p.length;
    j["crc32c"] = p.crc;
    pieces.push_back(std::move(j));
  }
  return ordered_json{{"name", f.name},
          {"rank", f.rank},
          {"bytes", f.bytes},
          {"header_crc32c", f.header_crc},
          {"meta", {{"offset", f.meta.offset}, {"length", f.meta.length}, {"crc32c", f.meta.crc}}},
          {"pieces", pieces}};
}

ordered_json manifest_to_json(const Manifest& m) {
  ordered_json tensors = ordered_json::array(), files = ordered_json::array();
  for (const TensorInfo& t : m.tensors) tensors.push_back(tensor_to_json(t));
  for (const FileRecord& f : m.files) files.push_back(file_to_json(f));
  ordered_json j{{"format", kFormatName},         {"version", m.version},
                 {"step", m.step},                {"save_id", m.save_id},
                 {"created_unix", m.created_unix}, {"world_size", m.world_size},
                 {"chunk_bytes", m.chunk_bytes},  {"meta", ordered_json(m.meta)},
                 {"tensors", tensors},            {"files", files}};
  j["manifest_crc32c"] = manifest_crc(json::parse(j.dump()));  // as a reader will parse it
  return j;
}

uint32_t manifest_crc(json j) {
  j.erase("manifest_crc32c");
  const std::string text = j.dump();
  return crc32c(text.data(), text.size());
}

TensorInfo tensor_from_json(const json& j, const std::string& where) {
  TensorInfo t;
  t.name = get<std::string>(j, "name", where);
  const std::string w = where + " tensor '" + t.name + "'";
  t.global_shape = get<std::vector<int64_t>>(j, "shape", w);
  for (int64_t d : t.global_shape)
    if (d < 0) fail("%s: negative dimension in its shape", w.c_str());
  t.dtype = dtype_from_name(get<std::string>(j, "dtype", w));
  return t;
}

FileRecord file_from_json(const json& j, const std::string& where) {
  FileRecord f;
  f.name = get<std::string>(j, "name", where);
  const std::string w = where + " file '" + f.name + "'";
  f.rank = get<int>(j, "rank", w);
  f.bytes = get<uint64_t>(j, "bytes", w);
  f.header_crc = get<uint32_t>(j, "header_crc32c", w);
  const json& meta = field(j, "meta", w);
  f.meta = {get<uint64_t>(meta, "offset", w + " meta"), get<uint64_t>(meta, "length", w + " meta"),
            get<uint32_t>(meta, "crc32c", w + " meta")};
  const json& pieces = field(j, "pieces", w);
  if (!pieces.is_array()) fail("%s: 'pieces' is not an array", w.c_str());
  for (const json& pj : pieces) {
    PieceRecord p;
    p.tensor = get<std::string>(pj, "tensor", w);
    const std::string pw = w + " piece of '" + p.tensor + "'";
    const std::string kind = get<std::string>(pj, "kind", pw);
    if (kind != "flat" && kind != "box")
      fail("%s: piece kind '%s' is not supported by this build (it reads 'flat' and 'box')", pw.c_str(), kind.c_str());
    if (kind == "box") {
      const json& box = field(pj, "box", pw);
      p.box_offset = get<std::vector<int64_t>>(box, "offset", pw + " box");
      p.box_extent = get<std::vector<int64_t>>(box, "extent", pw + " box");
      if (p.box_extent.empty()) fail("%s: a box piece without an extent", pw.c_str());
    }
    const auto flat = get<std::vector<int64_t>>(pj, "flat", pw);
    if (flat.size() != 2 || flat[0] < 0 || flat[1] < flat[0]) fail("%s: bad 'flat' range", pw.c_str());
    p.flat_begin = flat[0];
    p.flat_end = flat[1];
    p.offset = get<uint64_t>(pj, "offset", pw);
    p.length = get<uint64_t>(pj, "length", pw);
    p.crc = get<std::vector<uint32_t>>(pj, "crc32c", pw);
    f.pieces.push_back(std::move(p));
  }
  return f;
}

Manifest manifest_from_json(const json& j, const std::string& where) {
  if (!j.is_object() || j.value("format", "") != kFormatName)
    fail("%s is not a minitrain checkpoint manifest (no \"format\": \"%s\")", where.c_str(), kFormatName);
  Manifest m;
  m.version = get<int>(j, "version", where);
  if (m.version != kFormatVersion)
    fail("%s: checkpoint format version %d is not supported by this build (it reads version %d)", where.c_str(),
         m.version, kFormatVersion);
  // Everything a resume reads from here on (the step, the trainer's meta, the file table) is checked.
  if (!j.contains("manifest_crc32c"))
    fail("%s has no manifest_crc32c (written by an older build): its contents cannot be checked", where.c_str());
  const uint32_t crc = get<uint32_t>(j, "manifest_crc32c", where);
  if (manifest_crc(j) != crc)
    fail("%s: manifest checksum mismatch (the file was edited or damaged after it was written)", where.c_str());
  m.step = get<int64_t>(j, "step", where);
  m.save_id = get<std::string>(j, "save_id", where);
  m.created_unix = get<double>(j, "created_unix", where);
  m.world_size = get<int>(j, "world_size", where);
  m.chunk_bytes = get<uint64_t>(j, "chunk_bytes", where);
  if (m.chunk_bytes == 0) fail("%s: chunk_bytes is 0", where.c_str());
  m.meta = field(j, "meta", where);
  const json& tensors = field(j, "tensors", where);
  const json& files = field(j, "files", where);
  if (!tensors.is_array() || !files.is_array()) fail("%s: 'tensors' and 'files' must be arrays", where.c_str());
  for (const json& t : tensors) m.tensors.push_back(tensor_from_json(t, where));
  for (const json& f : files) m.files.push_back(file_from_json(f, where));
  return m;
}

Manifest read_manifest(const std::string& ckpt_dir) {
  const std::string path = io::join(ckpt_dir, kManifestName);
  if (!io::exists(ckpt_dir)) fail("%s is not a checkpoint: it does not exist", ckpt_dir.c_str());
  if (!io::is_dir(ckpt_dir)) fail("%s is not a checkpoint: not a directory", ckpt_dir.c_str());
  if (!io::exists(path)) {
    if (io::exists(io::join(ckpt_dir, kLatestName)))
      fail("%s is a checkpoint root, not a checkpoint: name one of its step_* directories, or resume=auto",
           ckpt_dir.c_str());
    fail("%s is not a checkpoint (no %s; an unfinished save never has one)", ckpt_dir.c_str(), kManifestName);
  }
  const std::string text = io::read_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("%s: malformed JSON (%s)", path.c_str(), e.what());
  }
  return manifest_from_json(j, path);
}

std::string table_problem(const Manifest& m) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < m.tensors.size(); i++)
    if (!index.emplace(m.tensors[i].name, i).second) return strfmt("tensor '%s' is listed twice", m.tensors[i].name.c_str());
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges(m.tensors.size());
  for (const FileRecord& f : m.files) {
    // The header, the pieces and the metadata must tile the file exactly: then every byte is covered
    // by a checksum and nothing else hides in it.
    std::vector<std::pair<uint64_t, uint64_t>> regions = {{0, kHeaderBytes}, {f.meta.offset, f.meta.length}};
    for (const PieceRecord& p : f.pieces) regions.push_back({p.offset, p.length});
    std::sort(regions.begin(), regions.end());
    uint64_t end = 0;
    for (const auto& [off, len] : regions) {
      if (off != end) return strfmt("%s: its pieces do not tile the file (a gap or overlap at byte %llu)", f.name.c_str(), (unsigned long long)std::min(off, end));
      end = off + len;
    }
    if (end != f.bytes) return strfmt("%s: its pieces end at byte %llu, the file has %llu", f.name.c_str(), (unsigned long long)end, (unsigned long long)f.bytes);
    for (const PieceRecord& p : f.pieces) {
      auto it = index.find(p.tensor);
      if (it == index.end()) return strfmt("%s holds a piece of '%s', which is not in the tensor table", f.name.c_str(), p.tensor.c_str());
      const TensorInfo& t = m.tensors[it->second];
      const std::string where = p.problem(t.global_shape);
      if (!where.empty()) return strfmt("%s: a piece of '%s' %s", f.name.c_str(), p.tensor.c_str(), where.c_str());
      if (p.length != uint64_t(p.flat_end - p.flat_begin) * dtype_size(t.dtype))
        return strfmt("%s: piece [%lld, %lld) of '%s' has %llu bytes, its elements need %llu", f.name.c_str(),
                      (long long)p.flat_begin, (long long)p.flat_end, p.tensor.c_str(), (unsigned long long)p.length,
                      (unsigned long long)(uint64_t(p.flat_end - p.flat_begin) * dtype_size(t.dtype)));
      if (p.crc.size() != chunk_count(p.length, m.chunk_bytes))
        return strfmt("%s: piece of '%s' has %zu checksums, its length needs %zu", f.name.c_str(), p.tensor.c_str(),
                      p.crc.size(), chunk_count(p.length, m.chunk_bytes));
      if (p.offset < kHeaderBytes || p.offset + p.length > f.bytes)
        return strfmt("%s: piece of '%s' lies outside the file", f.name.c_str(), p.tensor.c_str());
      for_each_span_run(p, t.global_shape,
                        [&](int64_t gb, int64_t ge, int64_t) { ranges[it->second].push_back({gb, ge}); });
    }
  }
  for (size_t i = 0; i < m.tensors.size(); i++) {
    auto& r = ranges[i];
    std::sort(r.begin(), r.end());
    int64_t covered = 0;  // [0, covered) is held by some piece
    for (const auto& [b, e] : r) {
      if (b > covered) break;
      covered = std::max(covered, e);
    }
    if (covered < m.tensors[i].numel()) {
      int64_t gap_end = m.tensors[i].numel();
      for (const auto& [b, e] : r)
        if (b > covered) {
          gap_end = b;
          break;
        }
      return strfmt("tensor '%s': elements [%lld, %lld) are held by no file", m.tensors[i].name.c_str(),
                    (long long)covered, (long long)gap_end);
    }
  }
  return "";
}

}  // namespace mt::checkpoint
