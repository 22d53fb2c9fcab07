// A dataset: the shards of one source, read as one token stream cut into training windows.
//
// The stream is the shards concatenated in order. Because every document starts with its EOT,
// shard boundaries are document boundaries and the concatenation is again "documents joined by EOT".
// Window w (of length T) covers stream tokens [w*T, w*T + T]: T+1 tokens, inputs the first T,
// targets the last T, consecutive windows sharing one token so every token but the first is a
// target exactly once per epoch. A stream of N tokens has floor((N-1)/T) windows.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/shard.h"

namespace mt::data {

enum class Split { train, val };
const char* split_name(Split s);
Split split_from_name(const std::string& s);  // "train" | "val"; fails naming the value

// The shard files a source names, in stream order:
//  - a directory written by `data prepare`: the <split> shards listed in its meta.json (or, without
//    one, the files <split>_*.bin in name order);
//  - a single shard file (used for either split as given);
//  - a glob pattern (containing * ? or [): the matching files in name order.
// Fails naming the source when nothing matches.
std::vector<std::string> resolve_shards(const std::string& source, Split split);

class Dataset {
 public:
  // Opens (and, with verify, checksums) every shard; all must agree on vocab size and EOT id.
  Dataset(const std::string& source, Split split, bool verify = true);

  const std::string& source() const { return source_; }
  uint64_t num_tokens() const { return offsets_.back(); }
  uint64_t num_docs() const { return num_docs_; }
  uint32_t vocab_size() const { return vocab_; }
  uint32_t eot_token() const { return eot_; }
  // The tokenizer fingerprint recorded by `data prepare` in the meta.json of the directory holding
  // the (first) shard; "" when there is none (a shard made some other way).
  const std::string& tokenizer_fingerprint() const { return tokenizer_fp_; }
  size_t num_shards() const { return shards_.size(); }
  const Shard& shard(size_t i) const { return *shards_[i]; }

  uint64_t num_windows(int T) const;
  // out[k] = stream token begin + k, for k < n, reading across shard boundaries.
  void read(uint64_t begin, uint64_t n, int32_t* out) const;
  // Appends to `cuts` the offsets j in (0, n) (relative to begin) where a document starts inside
  // stream range [begin, begin + n).
  void doc_starts_in(uint64_t begin, uint64_t n, std::vector<int>& cuts) const;

 private:
  std::string source_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<uint64_t> offsets_;  // stream offset of each shard, plus the total at the end
  uint64_t num_docs_ = 0;
  uint32_t vocab_ = 0, eot_ = 0;
  std::string tokenizer_fp_;
  size_t shard_of(uint64_t pos) const;
};

}  // namespace mt::data
