// Token shards: one file holds a stream of token ids, the document boundaries inside it, and a
// header that says how to read and check them. The byte layout is specified in docs/data_format.md;
// scripts/shards.py reads and writes the same files with numpy.
//
// Every document in a shard is stored as [EOT, its tokens...]: the end-of-text token opens each
// document (as in GPT-2 training data), so a shard's stream and the concatenation of several
// shards are both "documents joined by EOT". The document index lists where each document's EOT sits.
//
// Writers never leave a partial file under the final name: they write `<path>.tmp.<pid>` and
// rename it. Readers verify everything a damaged or foreign file could get wrong (size, magic,
// version, widths, both CRCs, the index, token ids < vocab) and fail naming the file and the problem.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mt::data {

inline constexpr char kShardMagic[8] = {'M', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;

// The decoded header (all fields little-endian on disk; see docs/data_format.md for offsets).
struct ShardHeader {
  uint32_t version = kShardVersion;
  uint32_t token_bytes = 2;  // 2 (u16) or 4 (u32)
  uint32_t vocab_size = 0;
  uint32_t eot_token = 0;
  uint64_t num_tokens = 0;
  uint64_t num_docs = 0;
  uint32_t data_crc = 0;    // CRC-32 of every byte after the header
  uint32_t header_crc = 0;  // CRC-32 of header bytes [0, 60), stored at offset 60
};

// CRC-32 (IEEE 802.3 polynomial, reflected; the value zlib.crc32 returns). Pass the previous result
// as `crc` to continue over several buffers; start with 0.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// The narrowest width that holds every id below vocab_size: 2 bytes up to 65536 ids, else 4.
uint32_t token_bytes_for_vocab(uint64_t vocab_size);

// Writes one shard atomically. `doc_starts` are the token offsets where documents begin (strictly
// increasing, first 0, each the position of that document's EOT); token ids must be < vocab_size.
// token_bytes 0 picks token_bytes_for_vocab(vocab_size).
void write_shard(const std::string& path, std::span<const int32_t> tokens, std::span<const uint64_t> doc_starts,
                 uint32_t vocab_size, uint32_t eot_token, uint32_t token_bytes = 0);

// Accumulates documents for one shard: add_document() appends [EOT, tokens...] and records its start.
class ShardBuilder {
 public:
  ShardBuilder(uint32_t vocab_size, uint32_t eot_token) : vocab_size_(vocab_size), eot_(eot_token) {}
  void add_document(std::span<const int32_t> tokens);
  uint64_t num_tokens() const { return tokens_.size(); }
  uint64_t num_docs() const { return doc_starts_.size(); }
  // Writes the shard (atomically) and empties the builder.
  void write(const std::string& path);

 private:
  uint32_t vocab_size_, eot_;
  std::vector<int32_t> tokens_;
  std::vector<uint64_t> doc_starts_;
};

// A verified, read-only, memory-mapped shard.
class Shard {
 public:
  // Opens and checks the file; verify_data = false skips the data CRC and the token-id scan (the
  // header, sizes and index order are always checked).
  explicit Shard(const std::string& path, bool verify_data = true);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& path() const { return path_; }
  const ShardHeader& header() const { return h_; }
  uint64_t num_tokens() const { return h_.num_tokens; }
  uint64_t num_docs() const { return h_.num_docs; }
  int32_t token(uint64_t i) const;
  // out[k] = token(begin + k) for k < n; begin + n <= num_tokens().
  void read(uint64_t begin, uint64_t n, int32_t* out) const;
  // Start offsets of the documents (length num_docs()), strictly increasing, first 0.
  const uint64_t* doc_starts() const { return index_; }

 private:
  std::string path_;
  ShardHeader h_;
  const unsigned char* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
  const uint64_t* index_ = nullptr;
};

// Header decoding shared by Shard and `minitrain data inspect`: reads and checks only the header of
// `path`, failing on a short file, wrong magic, unknown version, bad width or header CRC mismatch.
ShardHeader read_shard_header(const std::string& path);

// Byte offset of the document index inside a shard (the token region is padded to 8 bytes).
uint64_t shard_index_offset(const ShardHeader& h);
uint64_t shard_file_bytes(const ShardHeader& h);

}  // namespace mt::data
