// The on-disk checkpoint format (specified in docs/checkpoint_format.md): names, the rank-file
// header, and the manifest with its JSON form.
//
//   <root>/step_000120/manifest.json     written last; its presence is what makes a checkpoint
//   <root>/step_000120/rank_00000.bin    one per writing rank: header, pieces, rank metadata
//   <root>/latest                        "step_000120\n", replaced by rename after each commit
//
// Tensors are stored as pieces that name their place in the GLOBAL tensor, never in a rank's
// layout, so any layout can read them back (Megatron-Core's distributed checkpoints do the same).
// A piece is a range of the row-major flattening ("kind": "flat"); a tensor-parallel box (offset
// and shape per dimension) is a future "kind": "box" that older readers reject by name.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/box.h"
#include "runtime/dtype.h"

namespace mt::checkpoint {

inline constexpr const char* kFormatName = "minitrain-checkpoint";
inline constexpr int kFormatVersion = 1;
// Checksums cover chunks of this many bytes of a piece, so a reader of a sub-range verifies (and
// reads) only the chunks it touches. Recorded in each manifest; readers use the recorded value.
inline constexpr uint64_t kChunkBytes = uint64_t(4) << 20;
inline constexpr size_t kHeaderBytes = 64;

struct TensorInfo {
  std::string name;
  std::vector<int64_t> global_shape;
  DType dtype = DType::f32;
  int64_t numel() const;
};

// Which elements of its tensor a piece holds. A "flat" piece: elements [flat_begin, flat_end) of the
// tensor's row-major flattening. A "box" piece (a tensor-parallel block): the box of extent
// `box_extent` at `box_offset` (one entry per dimension of the tensor's shape), and of the box's own
// row-major flattening the elements [flat_begin, flat_end) (a ZeRO shard of the block).
struct PieceSpan {
  int64_t flat_begin = 0, flat_end = 0;
  std::vector<int64_t> box_offset, box_extent;  // empty: a flat piece
  bool is_box() const { return !box_extent.empty(); }
  int64_t numel() const { return flat_end - flat_begin; }
  // The box within `shape` (the whole tensor as one box for a flat piece).
  ParamBox box(const std::vector<int64_t>& shape) const;
  // "" when the span lies inside a tensor of `shape`, else what is wrong.
  std::string problem(const std::vector<int64_t>& shape) const;
};

// Calls f(global_begin, global_end, piece_pos) for each contiguous run of the tensor's flat index
// that the span's elements form, in order; piece_pos counts elements from the span's start.
template <class F>
void for_each_span_run(const PieceSpan& s, const std::vector<int64_t>& shape, F f) {
  if (!s.is_box()) {
    if (s.flat_end > s.flat_begin) f(s.flat_begin, s.flat_end, int64_t(0));
    return;
  }
  for_each_box_run(s.box(shape), s.flat_begin, s.flat_end,
                   [&](int64_t gb, int64_t ge, int64_t local) { f(gb, ge, local - s.flat_begin); });
}

// A piece as stored: its span of `tensor`, at [offset, offset + length) of its file, with one
// CRC-32C per chunk_bytes chunk (the last one shorter).
struct PieceRecord : PieceSpan {
  std::string tensor;
  uint64_t offset = 0, length = 0;
  std::vector<uint32_t> crc;
};

struct BlobRecord {
  uint64_t offset = 0, length = 0;
  uint32_t crc = 0;
};

// One rank's data file. Its layout: header (kHeaderBytes), the pieces back to back in table order,
// then the rank metadata (JSON text). Every byte is covered by a checksum and `bytes` is the file size.
struct FileRecord {
  std::string name;
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t header_crc = 0;
  BlobRecord meta;
  std::vector<PieceRecord> pieces;
};

struct Manifest {
  int version = kFormatVersion;
  int64_t step = 0;
  int world_size = 1;
  std::string save_id;  // "<run id>-<step>": lets other ranks tell this commit from an older one
  double created_unix = 0;
  uint64_t chunk_bytes = kChunkBytes;
  nlohmann::json meta;  // the caller's global metadata (model config, layout, optimizer state, ...)
  std::vector<TensorInfo> tensors;
  std::vector<FileRecord> files;
};

// The fixed header at the start of every rank file (little-endian):
//   0 magic "MTCKPT\r\n"   8 u32 format version   12 u32 rank   16 u32 world size   20 u32 zero
//   24 i64 step            32..63 zero
std::string encode_header(int rank, int world_size, int64_t step);
// Checks a header against what the manifest says; throws naming `path` and the first mismatch.
void check_header(const void* header, const std::string& path, int rank, int world_size, int64_t step);

std::string step_dir_name(int64_t step);                        // "step_000120"
std::optional<int64_t> parse_step_dir_name(const std::string& name);  // nullopt unless step_<digits>
std::string rank_file_name(int rank);                            // "rank_00003.bin"
std::string rank_table_name(int rank);                           // "rank_00003.json" (the done marker)
std::string rank_failed_name(int rank);                          // "rank_00003.failed"
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kLatestName = "latest";

// Written with keys in the order of this page and the format doc, for people reading the files.
nlohmann::ordered_json tensor_to_json(const TensorInfo& t);
nlohmann::ordered_json file_to_json(const FileRecord& f);
// The manifest ends with its own checksum, "manifest_crc32c" (see manifest_crc()).
nlohmann::ordered_json manifest_to_json(const Manifest& m);
// CRC-32C of the manifest's compact JSON text with keys sorted, without its "manifest_crc32c"
// field. Parsing and printing again gives the same text, so layout and key order do not matter,
// but every value does: an edited step, update count or loader position fails the check.
uint32_t manifest_crc(nlohmann::json j);
// Parsers validate types and ranges and throw mt::Error prefixed with `where` (a path);
// manifest_from_json also checks the manifest's checksum.
TensorInfo tensor_from_json(const nlohmann::json& j, const std::string& where);
FileRecord file_from_json(const nlohmann::json& j, const std::string& where);
Manifest manifest_from_json(const nlohmann::json& j, const std::string& where);
// Reads and parses <ckpt_dir>/manifest.json, checking the format name and version.
Manifest read_manifest(const std::string& ckpt_dir);

// Number of checksum chunks of a piece of `length` bytes.
inline size_t chunk_count(uint64_t length, uint64_t chunk_bytes) {
  return size_t((length + chunk_bytes - 1) / chunk_bytes);
}

}  // namespace mt::checkpoint

namespace mt::checkpoint {

// "" when the table of `m` is consistent: every piece names a known tensor, lies inside it, has the
// byte length its element count needs and one checksum per chunk, lies inside its file; and the pieces
// of each tensor together cover all of its elements (overlaps, i.e. replicated copies, are allowed).
// Otherwise a description of the first problem found.
std::string table_problem(const Manifest& m);

}  // namespace mt::checkpoint
