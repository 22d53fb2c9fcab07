// Byte-level BPE (Sennrich et al. 2016; byte-level as in GPT-2, Radford et al. 2019).
//
// Every byte string is encodable: text is pre-tokenized (data/pretokenize.h), each piece starts as
// its bytes (one base token per byte value), and merges are applied in rank order, lowest first,
// each to all of its left-to-right non-overlapping occurrences, until no adjacent pair has a merge.
// decode() concatenates the bytes of the ids, so decode(encode(s)) == s for any bytes s, valid
// UTF-8 or not.
//
// Token ids: the 256 byte tokens, the merge results and one special end-of-text token
// "<|endoftext|>". A trained tokenizer numbers them 0..255 (byte b -> id b), 256 + i for merge i,
// and vocab_size - 1 for EOT; a GPT-2 tokenizer keeps GPT-2's numbering (EOT = 50256). encode()
// never produces EOT from text (the literal string "<|endoftext|>" in a document is encoded as
// ordinary bytes); the packer inserts EOT between documents.
//
// File formats: save()/load() use a JSON file of our own (docs/data_format.md, "tokenizer.json");
// load_gpt2() reads GPT-2's vocab.json + merges.txt.
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/log.h"

namespace mt::data {

inline constexpr std::string_view kEotText = "<|endoftext|>";

// A per-thread memo of piece -> ids; encoding real text hits it for most words. Not thread-safe:
// give each thread its own.
class EncodeCache {
 public:
  explicit EncodeCache(size_t max_entries = 1 << 18) : max_entries_(max_entries) {}
  const std::vector<int32_t>* find(std::string_view piece) const;
  void insert(std::string_view piece, const std::vector<int32_t>& ids);

 private:
  // Transparent hash and equality so lookups take a string_view without building a string.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  size_t max_entries_;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map_;
};

class Tokenizer {
 public:
  struct Merge {
    int32_t left, right, result;
  };

  // Learns merges on `texts` until the vocabulary (bytes + merges + EOT) has vocab_size tokens, or
  // earlier when no adjacent pair occurs at least twice. Pieces longer than 256 bytes are not
  // counted (they are rare and only add quadratic work). Uses all OpenMP threads for counting.
  static Tokenizer train(std::span<const std::string> texts, int vocab_size, const Logger* log = nullptr);
  // Own JSON format. Fails naming the file on any inconsistency.
  static Tokenizer load(const std::string& path);
  // GPT-2 vocab.json + merges.txt.
  static Tokenizer load_gpt2(const std::string& vocab_json, const std::string& merges_txt);
  // A tokenizer file of ours, a vocab.json (merges.txt beside it), or a directory holding either.
  static Tokenizer load_any(const std::string& path);
  // Builds from parts (checks them): byte_ids[b] = id of byte b; merges in rank order.
  Tokenizer(std::array<int32_t, 256> byte_ids, std::vector<Merge> merges, int32_t eot_token, int vocab_size,
            const std::string& origin);

  // Writes atomically (temp file + rename). `provenance`, if not null, is stored under that key
  // (e.g. what the tokenizer was trained on) and ignored by load().
  void save(const std::string& path, const nlohmann::json& provenance = nullptr) const;

  std::vector<int32_t> encode(std::string_view text) const;
  void encode_append(std::string_view text, std::vector<int32_t>& out, EncodeCache& cache) const;
  // One pre-tokenized piece. heap = true uses the O(n log n) priority-queue merge loop that
  // encode_append picks for long pieces; both give identical ids (tests compare them).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out, bool heap) const;
  // Fails naming the id if one is outside the vocabulary.
  std::string decode(std::span<const int32_t> ids) const;

  int vocab_size() const { return vocab_size_; }
  int32_t eot_token() const { return eot_; }
  size_t num_merges() const { return merges_.size(); }
  const std::vector<Merge>& merges() const { return merges_; }
  const std::array<int32_t, 256>& byte_ids() const { return byte_ids_; }
  const std::string& token_bytes(int32_t id) const { return bytes_[size_t(id)]; }
  // A hash of the byte ids, merges and EOT: equal fingerprints encode identically.
  uint64_t fingerprint() const;

 private:
  std::array<int32_t, 256> byte_ids_{};
  std::vector<Merge> merges_;
  int32_t eot_ = 0;
  int vocab_size_ = 0;
  std::vector<std::string> bytes_;                      // id -> its bytes ("" for EOT)
  std::unordered_map<uint64_t, uint64_t> rank_;          // (left << 32 | right) -> (rank << 32 | result)
  bool find_merge(int32_t left, int32_t right, uint32_t& rank, int32_t& result) const;
};

}  // namespace mt::data
