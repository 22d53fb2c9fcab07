// Finding, checking and reading checkpoints, under any layout.
//
// A reader asks for a flat range of a GLOBAL tensor and gets it assembled from whichever rank files
// hold it, so a checkpoint written by dp=4 / ZeRO-1 loads under dp=2 / ZeRO-3 (or one rank): each
// rank just asks for its own new shard. Every byte read is checked against its chunk checksum, and
// every value must be finite (a NaN or inf is refused like a checksum mismatch).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/format.h"
#include "checkpoint/fsio.h"
#include "parallel/comm.h"
#include "runtime/log.h"

namespace mt::checkpoint {

struct Found {
  std::string path;
  int64_t step = 0;
};

// Collective. Rank 0 scans `dir`, picks the newest checkpoint (catalog.h: by commit time, then step)
// whose manifest, files and checksums verify, logging each one it skips and why, and broadcasts the
// choice; every rank returns the same answer (nullopt: `dir` holds no checkpoint, e.g. a fresh run).
// When it holds checkpoints but none verifies, every rank throws CollectiveError, rank 0's naming
// each checkpoint and why it was refused.
// With `run_id`, only the checkpoints of that run (metadata "run_id") count: the others are left
// alone, named in one log line, and never chosen (nor refused).
std::optional<Found> find_latest_valid(const std::string& dir, parallel::Comm& world, const Logger& log,
                                       const std::string& run_id = "");

class Reader {
 public:
  // Reads and checks manifest.json (format name and version, table consistency), opens every rank
  // file and checks its size and header. Throws mt::Error naming the path and the problem.
  explicit Reader(const std::string& ckpt_path);

  const std::string& path() const { return path_; }
  int64_t step() const { return m_.step; }
  const nlohmann::json& global_meta() const { return m_.meta; }
  const std::vector<TensorInfo>& tensors() const { return m_.tensors; }
  const Manifest& manifest() const { return m_; }

  // Fills out[0 .. flat_end - flat_begin) with elements [flat_begin, flat_end) of global tensor
  // `name`, from whichever files hold them (flat pieces or boxes), verifying the checksum of every
  // chunk it reads; a chunk read in part is kept, so reading a box run by run checks it once.
  void read(const std::string& name, int64_t flat_begin, int64_t flat_end, float* out) const;
  // The rank_meta of each writing rank, in rank order (checksums verified).
  std::vector<nlohmann::json> rank_metas() const;
  // Fails unless every tensor of `expected` is in the checkpoint with the same global shape and
  // dtype, naming the first difference (a checkpoint of another model shape).
  void check_tensors(const std::vector<TensorInfo>& expected) const;
  // Reads every byte of every file and checks it against the manifest (see verify()).
  void verify_all() const;

 private:
  const TensorInfo& tensor(const std::string& name) const;
  // Reads bytes [from, to) of piece `p` of file `f` into out, checking the chunks they touch.
  void read_piece_bytes(size_t f, const PieceRecord& p, uint64_t from, uint64_t to, char* out) const;
  nlohmann::json read_meta(size_t f) const;

  std::string path_;
  Manifest m_;
  std::vector<io::InFile> files_;
  std::unordered_map<std::string, size_t> tensor_index_;
  std::vector<std::vector<std::pair<size_t, size_t>>> pieces_of_;  // per tensor: (file, piece), by flat_begin
  // The last chunk read for a partial request, verified: the next read from it skips the checksum.
  struct ChunkCache {
    size_t file = 0;
    const PieceRecord* piece = nullptr;
    uint64_t chunk = 0;
    std::vector<char> bytes;
  };
  mutable ChunkCache cache_;
};

// Full verification of one checkpoint: manifest, table coverage of every tensor, file sizes and
// headers, every checksum. Throws mt::Error naming the file and the problem. For `ckpt verify` and resume.
void verify(const std::string& ckpt_path);

}  // namespace mt::checkpoint
