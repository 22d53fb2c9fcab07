#include "train/batches.h"

#include <random>

#include "runtime/check.h"

namespace mt::train {

model::MicroBatch HostBatch::view() const {
  model::MicroBatch mb;
  mb.B = B;
  mb.T = T;
  mb.tokens = tokens.data();
  mb.targets = targets.data();
  mb.positions = positions.empty() ? nullptr : positions.data();
  mb.doc_ids = doc_ids.empty() ? nullptr : doc_ids.data();
  return mb;
}

int HostBatch::valid_targets() const {
  int n = 0;
  for (int32_t t : targets) n += t >= 0;
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
    b.B = B_;
    b.T = T_;
    b.tokens.resize(size_t(B_) * T_);
    b.targets.resize(size_t(B_) * T_);
    for (auto& t : b.tokens) t = d(rng);
    for (auto& t : b.targets) t = d(rng);
    b.positions.clear();
    b.doc_ids.clear();
  }
  nlohmann::json state() const override { return {{"synthetic_index", index_}}; }
  void restore(const nlohmann::json& s) override { index_ = s.at("synthetic_index"); }
  double wait_seconds() const override { return 0; }
  int vocab_size() const override { return vocab_; }

 private:
  int B_, T_, vocab_;
  uint64_t seed_;
  uint64_t index_ = 0;
};

}  // namespace

std::unique_ptr<BatchSource> open_batches(const TrainOptions& o, const std::string& split, int dp_rank, int dp_size) {
  (void)dp_size;
  if (o.data.path == "synthetic")
    return std::make_unique<SyntheticBatches>(o.batch_size, o.seq_len, o.model.vocab_size,
                                              o.seed + (split == "val" ? 7777 : 0), dp_rank);
  if (o.data.path.empty()) fail("no training data: set data.path=<token shard or dataset dir> (or --data)");
  fail("data.path '%s': shard loading is not wired yet", o.data.path.c_str());
}

}  // namespace mt::train
