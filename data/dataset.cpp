#include "data/dataset.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/check.h"

namespace mt::data {

namespace fs = std::filesystem;

const char* split_name(Split s) { return s == Split::train ? "train" : "val"; }

Split split_from_name(const std::string& s) {
  if (s == "train") return Split::train;
  if (s == "val") return Split::val;
  fail("data split '%s' is not one of train|val", s.c_str());
}

static std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g{};
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; i++)
      if (fs::is_regular_file(g.gl_pathv[i])) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> resolve_shards(const std::string& source, Split split) {
  std::error_code ec;
  if (fs::is_directory(source, ec)) {
    fs::path meta = fs::path(source) / "meta.json";
    if (fs::exists(meta)) {
      std::ifstream in(meta);
      nlohmann::json j;
      try {
        in >> j;
      } catch (const std::exception& e) {
        fail("%s: unreadable dataset manifest: %s", meta.c_str(), e.what());
      }
      std::vector<std::string> out;
      try {
        for (const auto& s : j.at("splits").at(split_name(split)).at("shards"))
          out.push_back((fs::path(source) / s.at("file").get<std::string>()).string());
      } catch (const nlohmann::json::exception& e) {
        fail("%s: malformed dataset manifest: %s", meta.c_str(), e.what());
      }
      if (out.empty()) fail("%s: the dataset has no %s shards", source.c_str(), split_name(split));
      return out;
    }
    auto out = glob_files((fs::path(source) / (std::string(split_name(split)) + "_*.bin")).string());
    if (out.empty()) fail("%s: no %s_*.bin shards in this directory", source.c_str(), split_name(split));
    return out;
  }
  if (source.find_first_of("*?[") != std::string::npos) {
    auto out = glob_files(source);
    if (out.empty()) fail("%s: the pattern matches no shard files", source.c_str());
    return out;
  }
  if (!fs::exists(source, ec)) fail("%s: no such dataset file or directory", source.c_str());
  return {source};
}

// The "tokenizer_fingerprint" of the meta.json beside `shard`, or "".
static std::string recorded_tokenizer(const std::string& shard) {
  const fs::path meta = fs::path(shard).parent_path() / "meta.json";
  std::error_code ec;
  if (!fs::exists(meta, ec)) return "";
  std::ifstream in(meta);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) fail("%s: unreadable dataset manifest", meta.c_str());
  const auto it = j.is_object() ? j.find("tokenizer_fingerprint") : j.end();
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

Dataset::Dataset(const std::string& source, Split split, bool verify) : source_(source) {
  std::vector<std::string> paths = resolve_shards(source, split);
  tokenizer_fp_ = recorded_tokenizer(paths[0]);
  shards_.resize(paths.size());
  // Shards verify independently (each CRC pass is sequential), so spread them over the cores.
  std::vector<std::string> errors(paths.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < paths.size(); i++) {
    try {
      shards_[i] = std::make_unique<Shard>(paths[i], verify);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  }
  for (const auto& e : errors)
    if (!e.empty()) throw Error(e);
  offsets_.push_back(0);
  for (size_t i = 0; i < shards_.size(); i++) {
    const ShardHeader& h = shards_[i]->header();
    if (i == 0) {
      vocab_ = h.vocab_size;
      eot_ = h.eot_token;
    } else if (h.vocab_size != vocab_ || h.eot_token != eot_) {
      fail("%s: vocab %u / end-of-text %u differs from %s (vocab %u / end-of-text %u): shards of one dataset "
           "must share a tokenizer", paths[i].c_str(), h.vocab_size, h.eot_token, paths[0].c_str(), vocab_, eot_);
    }
    offsets_.push_back(offsets_.back() + h.num_tokens);
    num_docs_ += h.num_docs;
  }
}

uint64_t Dataset::num_windows(int T) const {
  MT_CHECK(T > 0, "sequence length %d", T);
  uint64_t n = num_tokens();
  return n <= 1 ? 0 : (n - 1) / uint64_t(T);
}

size_t Dataset::shard_of(uint64_t pos) const {
  // The last shard whose offset is <= pos (empty shards are skipped by upper_bound).
  return size_t(std::upper_bound(offsets_.begin(), offsets_.end() - 1, pos) - offsets_.begin()) - 1;
}

void Dataset::read(uint64_t begin, uint64_t n, int32_t* out) const {
  MT_CHECK(begin + n <= num_tokens(), "%s: read past the end of the stream", source_.c_str());
  while (n > 0) {
    size_t s = shard_of(begin);
    uint64_t local = begin - offsets_[s];
    uint64_t take = std::min(n, offsets_[s + 1] - begin);
    shards_[s]->read(local, take, out);
    out += take;
    begin += take;
    n -= take;
  }
}

void Dataset::doc_starts_in(uint64_t begin, uint64_t n, std::vector<int>& cuts) const {
  uint64_t end = begin + n;
  for (uint64_t pos = begin; pos < end;) {
    size_t s = shard_of(pos);
    const Shard& sh = *shards_[s];
    uint64_t lo = pos - offsets_[s], hi = std::min(end, offsets_[s + 1]) - offsets_[s];
    const uint64_t* idx = sh.doc_starts();
    // Starts strictly after `begin` (a document starting exactly at the window start is not a cut);
    // in later shards every start from their first token on counts.
    const uint64_t* it = pos == begin ? std::upper_bound(idx, idx + sh.num_docs(), lo)
                                      : std::lower_bound(idx, idx + sh.num_docs(), lo);
    for (; it != idx + sh.num_docs() && *it < hi; ++it) cuts.push_back(int(*it + offsets_[s] - begin));
    pos = offsets_[s + 1];
  }
}

}  // namespace mt::data
