#include "data/prepare.h"

#include <omp.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "data/dataset.h"
#include "data/pretokenize.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "runtime/check.h"

namespace mt::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kMetaVersion = 1;
constexpr const char* kPending = ".pending";
constexpr uint64_t kEncodeBatchBytes = uint64_t(64) << 20;  // documents encoded per parallel batch

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string hex64(uint64_t v) { return strfmt("%016llx", (unsigned long long)v); }

std::string shard_name(Split s, size_t i) { return strfmt("%s_%06zu.bin", split_name(s), i); }

json read_json_or_null(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return nullptr;
  try {
    return json::parse(in);
  } catch (...) {
    return nullptr;
  }
}

void write_json_atomic(const fs::path& p, const json& j) {
  std::string tmp = p.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) fail("%s: cannot write", tmp.c_str());
    out << j.dump(1) << "\n";
    if (!out.flush()) fail("%s: write failed", tmp.c_str());
  }
  if (std::rename(tmp.c_str(), p.c_str()) != 0) fail("%s: cannot rename into place", p.c_str());
}

// True when out/meta.json was written for exactly this fingerprint and its shards are all there.
bool outputs_match(const fs::path& out, const json& fp, json& meta) {
  meta = read_json_or_null(out / "meta.json");
  if (!meta.is_object() || meta.value("fingerprint", json()) != fp) return false;
  if (!fs::exists(out / "tokenizer.json")) return false;
  try {
    for (const char* split : {"train", "val"})
      for (const auto& s : meta.at("splits").at(split).at("shards")) {
        fs::path f = out / s.at("file").get<std::string>();
        if (!fs::exists(f) || read_shard_header(f.string()).num_tokens != s.at("tokens").get<uint64_t>())
          return false;
      }
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// Removes what a previous run left: the manifest first (so the directory stops looking complete),
// then shards and temporary files.
void clear_outputs(const fs::path& out) {
  std::error_code ec;
  fs::remove(out / "meta.json", ec);
  for (const auto& e : fs::directory_iterator(out, ec)) {
    std::string n = e.path().filename().string();
    bool shard = (n.rfind("train_", 0) == 0 || n.rfind("val_", 0) == 0) && n.size() > 4 &&
                 n.compare(n.size() - 4, 4, ".bin") == 0;
    bool partial = n.find(".tmp.") != std::string::npos || n.find(kPending) != std::string::npos;
    if (shard || partial) fs::remove(e.path(), ec);
  }
}

// Writes full shards as documents arrive and records them for the manifest.
class SplitWriter {
 public:
  SplitWriter(fs::path dir, Split split, const Tokenizer& tok, uint64_t shard_tokens)
      : dir_(std::move(dir)), split_(split), b_(uint32_t(tok.vocab_size()), uint32_t(tok.eot_token())),
        shard_tokens_(shard_tokens) {}
  void add(const std::vector<int32_t>& doc) {
    b_.add_document(doc);
    docs_++;
    tokens_ += doc.size() + 1;
    if (b_.num_tokens() >= shard_tokens_) flush();
  }
  void flush() {
    if (b_.num_tokens() == 0) return;
    std::string name = shard_name(split_, shards_.size());
    shards_.push_back({{"file", name}, {"tokens", b_.num_tokens()}, {"docs", b_.num_docs()}});
    b_.write((dir_ / (name + kPending)).string());
  }
  // Gives the finished shards their final names (only once every shard of the run is written, so a
  // run that dies midway leaves no "<split>_*.bin" a loader could mistake for a dataset).
  void publish() const {
    for (const auto& s : shards_) {
      fs::path final_name = dir_ / s.at("file").get<std::string>();
      fs::path pending = final_name.string() + kPending;
      if (std::rename(pending.c_str(), final_name.c_str()) != 0)
        fail("%s: cannot rename into place: %s", pending.c_str(), std::strerror(errno));
    }
  }
  json manifest() const { return {{"docs", docs_}, {"tokens", tokens_}, {"shards", shards_}}; }
  uint64_t docs() const { return docs_; }
  uint64_t tokens() const { return tokens_; }
  size_t shards() const { return shards_.size(); }

 private:
  fs::path dir_;
  Split split_;
  ShardBuilder b_;
  uint64_t shard_tokens_;
  uint64_t docs_ = 0, tokens_ = 0;
  json shards_ = json::array();
};

PrepareReport report_from_meta(const json& meta) {
  PrepareReport r;
  r.reused = true;
  r.vocab_size = meta.at("vocab_size").get<int>();
  r.eot_token = meta.at("eot_token").get<int>();
  const json& tr = meta.at("splits").at("train");
  const json& va = meta.at("splits").at("val");
  r.train_docs = tr.at("docs").get<uint64_t>();
  r.train_tokens = tr.at("tokens").get<uint64_t>();
  r.train_shards = tr.at("shards").size();
  r.val_docs = va.at("docs").get<uint64_t>();
  r.val_tokens = va.at("tokens").get<uint64_t>();
  r.val_shards = va.at("shards").size();
  r.files = meta.at("totals").at("files").get<uint64_t>();
  r.bytes = meta.at("totals").at("bytes").get<uint64_t>();
  return r;
}

}  // namespace

PrepareReport prepare_dataset(const PrepareOptions& opt, const Logger& log) {
  auto t0 = std::chrono::steady_clock::now();
  if (opt.out_dir.empty()) fail("--out: no output directory given");
  if (!(opt.val_fraction >= 0 && opt.val_fraction < 1)) fail("--val-fraction %g must be in [0, 1)", opt.val_fraction);
  if (opt.shard_tokens < 1) fail("--shard-tokens must be positive");
  if (opt.tokenizer.empty() && opt.vocab_size < 257)
    fail("--vocab %d is too small (at least 257: 256 bytes + end-of-text)", opt.vocab_size);
  if (opt.threads < 0) fail("--threads %d must be >= 0", opt.threads);
  const int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();

  std::vector<InputFile> files = expand_inputs(opt.inputs, opt.splitter);
  json inputs = json::array();
  for (const InputFile& f : files) inputs.push_back({f.path, f.size, f.mtime_ns});
  std::optional<Tokenizer> given;
  if (!opt.tokenizer.empty()) given = Tokenizer::load_any(opt.tokenizer);
  json train_src = {{"inputs", inputs},
                    {"splitter", splitter_name(opt.splitter)},
                    {"pretokenizer", pretokenizer_id()},
                    {"vocab_size", opt.vocab_size},
                    {"sample_bytes", opt.tokenizer_sample_bytes}};
  json fp = {{"format_version", kMetaVersion},
             {"inputs", inputs},
             {"splitter", splitter_name(opt.splitter)},
             {"pretokenizer", pretokenizer_id()},
             {"tokenizer", given ? json(hex64(given->fingerprint())) : train_src},
             {"shard_tokens", opt.shard_tokens},
             {"val_fraction", opt.val_fraction}};

  fs::path out(opt.out_dir);
  json old_meta;
  if (!opt.force && outputs_match(out, fp, old_meta)) {
    PrepareReport r = report_from_meta(old_meta);
    r.seconds = seconds_since(t0);
    MT_LOG_INFO(log, "data prepare: %s is up to date for these inputs; reusing %zu train + %zu val shards",
                opt.out_dir.c_str(), r.train_shards, r.val_shards);
    return r;
  }
  // A directory this call creates goes again if the call fails (empty input, a full disk), so no
  // empty --out is left behind; an existing one loses its old outputs, never a mix of old and new.
  struct RemoveUnlessDone {
    fs::path dir;
    bool done = false;
    ~RemoveUnlessDone() {
      std::error_code ignored;
      if (!done && !dir.empty()) fs::remove_all(dir, ignored);
    }
  } created{fs::exists(out) ? fs::path() : out};
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out)) fail("--out %s: cannot create the directory: %s", opt.out_dir.c_str(),
                                         ec.message().c_str());
  clear_outputs(out);

  // Pass 1: count documents (for an exact validation share) and gather the tokenizer's sample.
  const fs::path tok_path = out / "tokenizer.json";
  json old_tok = given ? json() : read_json_or_null(tok_path);
  bool reuse_tok = !given && old_tok.is_object() && old_tok.value("provenance", json()) == train_src;
  bool need_sample = !given && !reuse_tok;
  std::vector<std::string> sample, docs;
  uint64_t sample_bytes = 0, total_docs = 0, total_bytes = 0;
  auto last_log = std::chrono::steady_clock::now();
  for (const InputFile& f : files) {
    if (seconds_since(last_log) > 2.0) {
      last_log = std::chrono::steady_clock::now();
      MT_LOG_INFO(log, "data prepare: scanning inputs: %.1f MB, %llu documents so far", total_bytes / 1e6,
                  (unsigned long long)total_docs);
    }
    docs.clear();
    split_documents(read_file(f.path), opt.splitter, f.path, docs);
    total_docs += docs.size();
    for (std::string& d : docs) {
      total_bytes += d.size();
      if (need_sample && sample_bytes < opt.tokenizer_sample_bytes) {
        sample_bytes += d.size();
        sample.push_back(std::move(d));
      }
    }
  }
  if (total_docs == 0) fail("--input: the %zu input file(s) contain no documents (empty or whitespace only)",
                            files.size());
  MT_LOG_INFO(log, "data prepare: %zu files, %llu documents, %.1f MB", files.size(), (unsigned long long)total_docs,
              total_bytes / 1e6);

  std::optional<Tokenizer> tok;
  if (given) {
    tok = std::move(given);
    tok->save(tok_path.string(), json{{"loaded_from", opt.tokenizer}});
  } else if (reuse_tok) {
    tok = Tokenizer::load(tok_path.string());
    MT_LOG_INFO(log, "data prepare: reusing %s (vocab %d)", tok_path.c_str(), tok->vocab_size());
  } else {
    auto tt = std::chrono::steady_clock::now();
    tok = Tokenizer::train(sample, opt.vocab_size, &log);
    MT_LOG_INFO(log, "data prepare: trained a %d-token BPE on %.1f MB in %.1f s", tok->vocab_size(),
                sample_bytes / 1e6, seconds_since(tt));
    tok->save(tok_path.string(), train_src);
  }
  sample.clear();
  sample.shrink_to_fit();

  // Evenly spread validation documents: document i is held out iff floor((i+1) n / D) > floor(i n / D).
  uint64_t n_val = 0;
  if (opt.val_fraction > 0 && total_docs >= 2)
    n_val = std::min(total_docs - 1, std::max<uint64_t>(1, uint64_t(std::llround(opt.val_fraction * total_docs))));
  if (opt.val_fraction > 0 && n_val == 0)
    MT_LOG_WARN(log, "data prepare: only one document; the validation split is empty");

  // Pass 2: encode batches of documents on all cores, then route them in order (so the output does
  // not depend on the thread count).
  SplitWriter train(out, Split::train, *tok, opt.shard_tokens), val(out, Split::val, *tok, opt.shard_tokens);
  std::vector<EncodeCache> caches(static_cast<size_t>(threads));
  std::vector<std::vector<int32_t>> encoded;
  uint64_t doc_index = 0, done_bytes = 0, batch_bytes = 0;
  double encode_s = 0;
  last_log = std::chrono::steady_clock::now();
  docs.clear();
  auto encode_batch = [&]() {
    encoded.assign(docs.size(), {});
    auto te = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      EncodeCache& cache = caches[size_t(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 16)
      for (size_t i = 0; i < docs.size(); i++) tok->encode_append(docs[i], encoded[i], cache);
    }
    encode_s += seconds_since(te);
    for (const auto& e : encoded) {
      bool is_val = n_val && (doc_index + 1) * n_val / total_docs > doc_index * n_val / total_docs;
      (is_val ? val : train).add(e);
      doc_index++;
    }
    done_bytes += batch_bytes;
    docs.clear();
    batch_bytes = 0;
    if (seconds_since(last_log) > 2.0) {
      last_log = std::chrono::steady_clock::now();
      MT_LOG_INFO(log, "data prepare: %.1f / %.1f MB, %llu docs, %.2fM tokens, %.1f MB/s", done_bytes / 1e6,
                  total_bytes / 1e6, (unsigned long long)doc_index, (train.tokens() + val.tokens()) / 1e6,
                  done_bytes / 1e6 / encode_s);
    }
  };
  for (const InputFile& f : files) {
    size_t before = docs.size();
    split_documents(read_file(f.path), opt.splitter, f.path, docs);
    for (size_t i = before; i < docs.size(); i++) batch_bytes += docs[i].size();
    if (batch_bytes >= kEncodeBatchBytes) encode_batch();
  }
  if (!docs.empty()) encode_batch();
  train.flush();
  val.flush();
  train.publish();
  val.publish();

  PrepareReport r;
  r.vocab_size = tok->vocab_size();
  r.eot_token = tok->eot_token();
  r.files = files.size();
  r.bytes = total_bytes;
  r.train_docs = train.docs();
  r.val_docs = val.docs();
  r.train_tokens = train.tokens();
  r.val_tokens = val.tokens();
  r.train_shards = train.shards();
  r.val_shards = val.shards();
  r.tokenize_seconds = encode_s;
  r.seconds = seconds_since(t0);
  json meta = {{"format", "minitrain-dataset"},
               {"version", kMetaVersion},
               {"fingerprint", fp},
               {"tokenizer", "tokenizer.json"},
               {"tokenizer_fingerprint", hex64(tok->fingerprint())},
               {"vocab_size", r.vocab_size},
               {"eot_token", r.eot_token},
               {"token_bytes", token_bytes_for_vocab(uint64_t(r.vocab_size))},
               {"splits", {{"train", train.manifest()}, {"val", val.manifest()}}},
               {"totals",
                {{"files", r.files},
                 {"bytes", r.bytes},
                 {"seconds", r.seconds},
                 {"threads", threads},
                 {"tokenize_mb_per_s", r.tokenize_mb_per_s()}}}};
  write_json_atomic(out / "meta.json", meta);
  created.done = true;
  MT_LOG_INFO(log, "data prepare: done in %.1f s: %llu docs (%llu val), %.2fM tokens (%.2fM val), %zu + %zu shards, "
              "tokenized at %.1f MB/s on %d threads", r.seconds, (unsigned long long)(r.train_docs + r.val_docs),
              (unsigned long long)r.val_docs, (r.train_tokens + r.val_tokens) / 1e6, r.val_tokens / 1e6,
              r.train_shards, r.val_shards, r.tokenize_mb_per_s(), threads);
  return r;
}

}  // namespace mt::data
