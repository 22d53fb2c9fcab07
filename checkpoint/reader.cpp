#include "checkpoint/reader.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "checkpoint/catalog.h"
#include "checkpoint/crc32c.h"
#include "runtime/check.h"

namespace mt::checkpoint {

using nlohmann::json;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

// Training state is never saved non-finite (train/divergence.h); a NaN or inf read back means a
// diverged run's checkpoint (written before that rule) or damage the checksums could not see.
void check_finite(const char* bytes, size_t n, const std::string& file, const PieceRecord& p, uint64_t at) {
  for (size_t i = 0; i + sizeof(float) <= n; i += sizeof(float)) {
    float x;
    std::memcpy(&x, bytes + i, sizeof x);
    if (!std::isfinite(x))
      fail("%s: tensor '%s' holds a non-finite value (%s) at element %lld: not a usable checkpoint", file.c_str(),
           p.tensor.c_str(), std::isnan(x) ? "NaN" : "inf", (long long)(p.flat_begin + int64_t((at + i) / sizeof(float))));
  }
}

}  // namespace

Reader::Reader(const std::string& ckpt_path) : path_(ckpt_path), m_(read_manifest(ckpt_path)) {
  const std::string manifest_path = io::join(path_, kManifestName);
  const std::string problem = table_problem(m_);
  if (!problem.empty()) fail("%s: %s", manifest_path.c_str(), problem.c_str());
  for (size_t i = 0; i < m_.tensors.size(); i++) tensor_index_[m_.tensors[i].name] = i;
  pieces_of_.resize(m_.tensors.size());
  files_.reserve(m_.files.size());
  for (size_t f = 0; f < m_.files.size(); f++) {
    const FileRecord& rec = m_.files[f];
    if (rec.name.find('/') != std::string::npos || rec.name.empty() || rec.name[0] == '.')
      fail("%s: file name '%s' is not a plain name", manifest_path.c_str(), rec.name.c_str());
    files_.emplace_back(io::join(path_, rec.name));
    const io::InFile& in = files_.back();
    if (in.size() != rec.bytes)
      fail("%s has %llu bytes, the manifest says %llu: the file is %s", in.path().c_str(),
           (unsigned long long)in.size(), (unsigned long long)rec.bytes, in.size() < rec.bytes ? "truncated" : "damaged");
    char header[kHeaderBytes];
    in.read_at(header, kHeaderBytes, 0);
    if (crc32c(header, kHeaderBytes) != rec.header_crc) fail("%s: header checksum mismatch: the file is corrupt", in.path().c_str());
    check_header(header, in.path(), rec.rank, m_.world_size, m_.step);
    for (size_t p = 0; p < rec.pieces.size(); p++) pieces_of_[tensor_index_.at(rec.pieces[p].tensor)].push_back({f, p});
  }
  for (auto& list : pieces_of_)
    std::sort(list.begin(), list.end(), [&](const auto& a, const auto& b) {
      return m_.files[a.first].pieces[a.second].flat_begin < m_.files[b.first].pieces[b.second].flat_begin;
    });
}

const TensorInfo& Reader::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) fail("checkpoint %s has no tensor '%s'", path_.c_str(), name.c_str());
  return m_.tensors[it->second];
}

void Reader::read_piece_bytes(size_t f, const PieceRecord& p, uint64_t from, uint64_t to, char* out) const {
  const io::InFile& in = files_[f];
  const uint64_t cb = m_.chunk_bytes;
  for (uint64_t c = from / cb; c * cb < to; c++) {
    const uint64_t c_begin = c * cb, c_end = std::min(p.length, c_begin + cb);
    const uint64_t lo = std::max(from, c_begin), hi = std::min(to, c_end);
    if (cache_.file == f && cache_.piece == &p && cache_.chunk == c) {  // verified already
      std::memcpy(out + (lo - from), cache_.bytes.data() + (lo - c_begin), size_t(hi - lo));
      continue;
    }
    // A chunk wholly inside the request is read straight into the output; a partial one is read into
    // the cache, so that the next small read from it (a box read run by run) is not checked again.
    const bool whole = lo == c_begin && hi == c_end;
    char* dst = out + (lo - from);
    if (!whole) {
      cache_.bytes.resize(size_t(c_end - c_begin));
      cache_.piece = nullptr;  // invalid until verified
      dst = cache_.bytes.data();
    }
    in.read_at(dst, size_t(c_end - c_begin), p.offset + c_begin);
    if (crc32c(dst, size_t(c_end - c_begin)) != p.crc[size_t(c)])
      fail("%s: checksum mismatch in tensor '%s' (bytes %llu..%llu of the file): the file is corrupt", in.path().c_str(),
           p.tensor.c_str(), (unsigned long long)(p.offset + c_begin), (unsigned long long)(p.offset + c_end));
    check_finite(dst, size_t(c_end - c_begin), in.path(), p, c_begin);
    if (!whole) {
      cache_ = {f, &p, c, std::move(cache_.bytes)};
      std::memcpy(out + (lo - from), cache_.bytes.data() + (lo - c_begin), size_t(hi - lo));
    }
  }
}

void Reader::read(const std::string& name, int64_t flat_begin, int64_t flat_end, float* out) const {
  const TensorInfo& t = tensor(name);
  if (t.dtype != DType::f32)
    fail("checkpoint %s: tensor '%s' is %s; only f32 tensors can be read so far", path_.c_str(), name.c_str(),
         dtype_name(t.dtype));
  if (flat_begin < 0 || flat_end < flat_begin || flat_end > t.numel())
    fail("checkpoint %s: range [%lld, %lld) is outside tensor '%s' (%lld elements)", path_.c_str(),
         (long long)flat_begin, (long long)flat_end, name.c_str(), (long long)t.numel());
  // Each piece (flat, or a box: several runs of the tensor) fills what it holds of the range and no
  // element is read twice (pieces overlap where state was replicated).
  std::vector<bool> filled(size_t(flat_end - flat_begin), false);
  int64_t missing = flat_end - flat_begin;
  for (const auto& [f, i] : pieces_of_[tensor_index_.at(name)]) {
    if (missing == 0) break;
    const PieceRecord& p = m_.files[f].pieces[i];
    for_each_span_run(p, t.global_shape, [&](int64_t gb, int64_t ge, int64_t at) {
      for (int64_t k = std::max(gb, flat_begin), end = std::min(ge, flat_end); k < end;) {
        if (filled[size_t(k - flat_begin)]) {
          k++;
          continue;
        }
        int64_t k2 = k;
        while (k2 < end && !filled[size_t(k2 - flat_begin)]) filled[size_t(k2++ - flat_begin)] = true;
        const uint64_t from = uint64_t(at + (k - gb)) * 4;
        read_piece_bytes(f, p, from, from + uint64_t(k2 - k) * 4, reinterpret_cast<char*>(out + (k - flat_begin)));
        missing -= k2 - k;
        k = k2;
      }
    });
  }
  if (missing > 0) {
    const int64_t pos = flat_begin + (std::find(filled.begin(), filled.end(), false) - filled.begin());
    fail("checkpoint %s: element %lld of tensor '%s' is in no file", path_.c_str(), (long long)pos, name.c_str());
  }
}

json Reader::read_meta(size_t f) const {
  const FileRecord& rec = m_.files[f];
  std::string text(size_t(rec.meta.length), '\0');
  files_[f].read_at(text.data(), text.size(), rec.meta.offset);
  if (crc32c(text.data(), text.size()) != rec.meta.crc)
    fail("%s: checksum mismatch in the rank metadata: the file is corrupt", files_[f].path().c_str());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("%s: malformed rank metadata (%s)", files_[f].path().c_str(), e.what());
  }
}

std::vector<json> Reader::rank_metas() const {
  std::vector<std::pair<int, size_t>> order;
  for (size_t f = 0; f < m_.files.size(); f++) order.push_back({m_.files[f].rank, f});
  std::sort(order.begin(), order.end());
  std::vector<json> out;
  for (const auto& [rank, f] : order) out.push_back(read_meta(f));
  return out;
}

void Reader::check_tensors(const std::vector<TensorInfo>& expected) const {
  for (const TensorInfo& e : expected) {
    auto it = tensor_index_.find(e.name);
    if (it == tensor_index_.end())
      fail("checkpoint %s does not fit this model: it has no tensor '%s' (another model shape?)", path_.c_str(),
           e.name.c_str());
    const TensorInfo& t = m_.tensors[it->second];
    if (t.global_shape != e.global_shape || t.dtype != e.dtype)
      fail("checkpoint %s does not fit this model: tensor '%s' is %s %s there, the model has %s %s", path_.c_str(),
           e.name.c_str(), dtype_name(t.dtype), shape_str(t.global_shape).c_str(), dtype_name(e.dtype),
           shape_str(e.global_shape).c_str());
  }
}

void Reader::verify_all() const {
  std::vector<char> buf;
  for (size_t f = 0; f < m_.files.size(); f++) {
    for (const PieceRecord& p : m_.files[f].pieces) {
      buf.resize(size_t(std::min<uint64_t>(p.length, m_.chunk_bytes)));
      // Chunk by chunk through one buffer: verification needs no memory proportional to the checkpoint.
      for (uint64_t at = 0; at < p.length; at += m_.chunk_bytes)
        read_piece_bytes(f, p, at, std::min(p.length, at + m_.chunk_bytes), buf.data());
    }
    read_meta(f);
  }
}

void verify(const std::string& ckpt_path) { Reader(ckpt_path).verify_all(); }

std::optional<Found> find_latest_valid(const std::string& dir, parallel::Comm& world, const Logger& log,
                                       const std::string& run_id) {
  MT_CHECK(world.device() == Device::cpu, "find_latest_valid: the communicator '%s' must be a host one",
           world.name().c_str());
  // [found, step low half, step high half]; i32 is the widest integer type collectives carry.
  int32_t msg[3] = {0, 0, 0};
  std::string why;
  if (world.rank() == 0) try {
    std::vector<CatalogEntry> all = list_checkpoints(dir);
    if (!run_id.empty()) {
      size_t others = 0;
      std::erase_if(all, [&](const CatalogEntry& e) {
        if (!e.problem.empty()) return false;  // unreadable: whose it is cannot be told
        bool other = true;
        try {
          other = read_manifest(e.path).meta.value("run_id", "") != run_id;
        } catch (const Error&) {
          return false;
        }
        others += other;
        return other;
      });
      if (others)
        MT_LOG_INFO(log, "checkpoint: %zu checkpoint(s) in %s belong to other runs than %s: not resumed", others,
                    dir.c_str(), run_id.c_str());
    }
    std::vector<std::pair<const CatalogEntry*, std::string>> refused;  // and why
    for (const CatalogEntry& e : all)
      if (!e.problem.empty()) refused.push_back({&e, e.problem});
    const CatalogEntry* chosen = nullptr;
    for (const CatalogEntry& e : all) {
      if (!e.problem.empty()) continue;
      try {
        verify(e.path);
        chosen = &e;
        break;
      } catch (const Error& err) {
        refused.push_back({&e, err.what()});
      }
    }
    if (!chosen && !refused.empty()) {
      // Checkpoints, but none usable: not a fresh start, which would overwrite and retire them.
      std::string list;
      for (const auto& [e, reason] : refused) list += strfmt("%s%s (%s)", list.empty() ? "" : "; ", e->name.c_str(), reason.c_str());
      fail("none of the %zu checkpoint(s) in %s verifies: %s", refused.size(), dir.c_str(), list.c_str());
    }
    // A checkpoint that failed verification was newer than the one chosen; one whose manifest cannot
    // be read has no commit time, so nothing is said about its age.
    for (const auto& [e, reason] : refused)
      if (e->problem.empty())
        MT_LOG_WARN(log, "checkpoint: skipping %s: %s; trying the next older one", e->path.c_str(), reason.c_str());
      else
        MT_LOG_WARN(log, "checkpoint: skipping %s: %s", e->path.c_str(), reason.c_str());
    if (chosen) {
      msg[0] = 1;
      msg[1] = int32_t(uint32_t(uint64_t(chosen->step)));
      msg[2] = int32_t(uint32_t(uint64_t(chosen->step) >> 32));
      const std::optional<std::string> latest = read_latest(dir);
      if (latest && *latest != chosen->name)
        MT_LOG_WARN(log, "checkpoint: %s/latest names %s, but %s is the newest checkpoint that verifies", dir.c_str(),
                    latest->c_str(), chosen->name.c_str());
      MT_LOG_INFO(log, "checkpoint: resuming from %s (step %lld)", chosen->path.c_str(), (long long)chosen->step);
    }
  } catch (const Error& e) {  // e.g. the directory cannot be listed: every rank fails together
    msg[0] = -1;
    why = e.what();
  }
  world.broadcast(msg, 3, DType::i32, 0);
  if (msg[0] < 0)
    throw parallel::CollectiveError(world.rank() == 0 ? why : strfmt("cannot search %s (see rank 0)", dir.c_str()));
  if (msg[0] == 0) return std::nullopt;
  const int64_t step = int64_t(uint64_t(uint32_t(msg[1])) | (uint64_t(uint32_t(msg[2])) << 32));
  return Found{io::join(dir, step_dir_name(step)), step};
}

}  // namespace mt::checkpoint
