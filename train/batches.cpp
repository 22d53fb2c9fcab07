#include "train/batches.h"

#include <random>

#include "data/loader.h"
#include "parallel/ring_attention.h"
#include "runtime/check.h"

namespace mt::train {

model::MicroBatch view(const HostBatch& b) {
  model::MicroBatch mb;
  mb.B = b.B;
  mb.T = b.T;
  mb.tokens = b.inputs.data();
  mb.targets = b.targets.data();
  mb.positions = b.positions_or_null();
  mb.doc_ids = b.doc_ids_or_null();
  return mb;
}

int valid_targets(const HostBatch& b) {
  int n = 0;
  for (int32_t t : b.targets) n += t >= 0;
  return n;
}

namespace {

// Uniformly random tokens for benchmarks (`data.path=synthetic`): a pure function of (seed, index).
class SyntheticBatches final : public BatchSource {
 public:
  SyntheticBatches(int B, int T, int vocab, uint64_t seed, int dp_rank)
      : B_(B), T_(T), vocab_(vocab), seed_(seed ^ (uint64_t(dp_rank) << 40)) {}
  void next(HostBatch& b) override {
    std::mt19937_64 rng(seed_ + 0x9E3779B97F4A7C15ULL * ++index_);
    std::uniform_int_distribution<int32_t> d(0, vocab_ - 1);
    b.resize(B_, T_, false);
    for (auto& t : b.inputs) t = d(rng);
    for (auto& t : b.targets) t = d(rng);
  }
  nlohmann::json state() const override { return {{"synthetic_index", index_}}; }
  void restore(const nlohmann::json& s) override { index_ = s.at("synthetic_index"); }
  double wait_seconds() const override { return 0; }
  int vocab_size() const override { return vocab_; }
  void rewind() override { index_ = 0; }

 private:
  int B_, T_, vocab_;
  uint64_t seed_;
  uint64_t index_ = 0;
};

// Token shards through data::Loader (sampling, packing, document masks, prefetch).
class ShardBatches final : public BatchSource {
 public:
  explicit ShardBatches(data::LoaderConfig cfg) : loader_(std::move(cfg)) {}
  void next(HostBatch& b) override { loader_.next(b); }
  nlohmann::json state() const override { return loader_.state(); }
  void restore(const nlohmann::json& s) override { loader_.restore(s); }
  double wait_seconds() const override { return loader_.wait_seconds(); }
  int vocab_size() const override { return int(loader_.vocab_size()); }
  void rewind() override { loader_.rewind(); }
  std::string tokenizer_fingerprint() const override { return loader_.tokenizer_fingerprint(); }
  std::string tokenizer_source() const override { return loader_.tokenizer_source(); }
  uint64_t num_tokens() const override { return loader_.num_tokens(); }
  uint64_t num_docs() const override { return loader_.num_docs(); }

 private:
  data::Loader loader_;
};

// Context parallelism: this rank's zigzag rows of every batch of `inner` (parallel/ring_attention.h),
// with their positions (the loader's, which restart at each document, or the index in the sequence)
// and document ids. Every rank of a cp group reads the same batches (the same dp rank) and keeps its
// 2 chunks of each row; the position in the data is the inner source's.
class ZigzagBatches final : public BatchSource {
 public:
  ZigzagBatches(std::unique_ptr<BatchSource> inner, int cp, int rank)
      : inner_(std::move(inner)), cp_(cp), rank_(rank) {}
  void next(HostBatch& b) override {
    inner_->next(full_);
    const parallel::Zigzag z{full_.T, cp_, rank_};
    Zigzag::check(full_.T, cp_);
    const int B = full_.B, Tl = z.local_len();
    b.resize(B, Tl, true);
    z.take(b.inputs.data(), full_.inputs.data(), B, 1);
    z.take(b.targets.data(), full_.targets.data(), B, 1);
    if (full_.positions.empty()) {
      for (int r = 0; r < B; r++)
        for (int t = 0; t < Tl; t++) b.positions[size_t(r) * size_t(Tl) + size_t(t)] = z.position(t);
    } else {
      z.take(b.positions.data(), full_.positions.data(), B, 1);
    }
    if (full_.doc_ids.empty()) b.doc_ids.clear();
    else z.take(b.doc_ids.data(), full_.doc_ids.data(), B, 1);
    b.row_dataset = full_.row_dataset;
    b.row_epoch = full_.row_epoch;
    b.row_window = full_.row_window;
  }
  nlohmann::json state() const override { return inner_->state(); }
  void restore(const nlohmann::json& s) override { inner_->restore(s); }
  double wait_seconds() const override { return inner_->wait_seconds(); }
  int vocab_size() const override { return inner_->vocab_size(); }
  void rewind() override { inner_->rewind(); }
  std::string tokenizer_fingerprint() const override { return inner_->tokenizer_fingerprint(); }
  std::string tokenizer_source() const override { return inner_->tokenizer_source(); }
  uint64_t num_tokens() const override { return inner_->num_tokens(); }
  uint64_t num_docs() const override { return inner_->num_docs(); }

 private:
  using Zigzag = parallel::Zigzag;
  std::unique_ptr<BatchSource> inner_;
  int cp_, rank_;
  HostBatch full_;
};

}  // namespace

std::unique_ptr<BatchSource> open_batches(const config::TrainOptions& o, const std::string& split, int dp_rank, int dp_size) {
  if (o.data.path == "synthetic")
    return std::make_unique<SyntheticBatches>(o.batch_size, o.seq_len, o.model.vocab_size,
                                              o.seed + (split == "val" ? 7777 : 0), dp_rank);
  if (o.data.path.empty() && o.data.mix.empty())
    fail("no training data: set data.path=<token shard or dataset dir> (or --data, or data.mix)");
  data::LoaderConfig c;
  const bool val = split == "val";
  if (val && !o.data.val_path.empty())
    c.sources = data::parse_mixture(o.data.val_path, "data.val_path");
  else
    c.sources = data::parse_mixture(o.data.mix.empty() ? o.data.path : o.data.mix,
                                    o.data.mix.empty() ? "data.path" : "data.mix");
  c.split = val && o.data.val_path.empty() ? data::Split::val : data::Split::train;
  c.B = o.batch_size;
  c.T = o.seq_len;
  c.seed = o.seed;
  c.dp_rank = dp_rank;
  c.dp_size = dp_size;
  c.mode = o.data.mode == "sequential" || val ? data::SampleMode::sequential : data::SampleMode::shuffled;
  c.doc_mask = o.data.doc_mask;
  c.prefetch = val ? 0 : o.data.prefetch;
  return std::make_unique<ShardBatches>(std::move(c));
}

void check_same_tokenizer(const config::TrainOptions& o, const BatchSource& train, const BatchSource& val) {
  const std::string a = train.tokenizer_fingerprint(), b = val.tokenizer_fingerprint();
  if (a.empty() || b.empty() || a == b) return;
  fail("%s %s (tokenizer fingerprint %s) and the training data %s (tokenizer fingerprint %s) were tokenized "
       "differently: validation data must share the training data's tokenizer",
       o.data.val_path.empty() ? "the validation split" : "data.val_path", val.tokenizer_source().c_str(), b.c_str(),
       train.tokenizer_source().c_str(), a.c_str());
}

std::unique_ptr<BatchSource> zigzag_batches(std::unique_ptr<BatchSource> inner, int cp, int cp_rank) {
  if (cp == 1) return inner;
  return std::make_unique<ZigzagBatches>(std::move(inner), cp, cp_rank);
}

}  // namespace mt::train
