// The training/validation data loader: datasets -> sampler -> packer -> (background) queue.
//
//   Loader train(cfg);               // opens and verifies the shards
//   train.restore(ckpt["data"]);     // optional: continue a run
//   for (...) { train.next(batch); ... }
//   ckpt["data"] = train.state();    // JSON; identical on every rank, independent of dp size
//
// Each call of next() returns this dp rank's B rows of the next global micro-batch (D*B rows, see
// data/sampler.h). With gradient accumulation a rank simply calls next() grad_accum times per
// optimizer step. Which rows a rank reads is a pure function of (seed, global position, dp rank,
// dp size); the state is the position in the global stream (per dataset, for mixtures), which does
// not depend on D or B, so a run resumed under another dp size (or rows per rank) continues the same
// global sequence with no duplicate and no gap.
//
// Prefetch: with prefetch > 0 a background thread produces batches ahead into a queue of that depth;
// the sequence is identical to prefetch = 0. wait_seconds() is the time next() spent blocked
// (with prefetch = 0, the time spent producing the batch), to report as data wait in the step split.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "data/packer.h"
#include "data/sampler.h"

namespace mt::data {

struct DataSource {
  std::string path;  // dataset dir, shard file or glob (see resolve_shards)
  double weight = 1.0;
};

// "dir" or "a:0.7,b:0.3" (weights need not sum to 1; the last ':' splits path and weight).
// Fails naming `flag` and the bad entry, or both entries when two name the same dataset.
std::vector<DataSource> parse_mixture(const std::string& spec, const char* flag = "data.mix");

struct LoaderConfig {
  std::vector<DataSource> sources;
  Split split = Split::train;
  int B = 0;                    // rows per dp rank per micro-batch
  int T = 0;                    // sequence length
  uint64_t seed = 0;
  int dp_rank = 0, dp_size = 1;
  SampleMode mode = SampleMode::shuffled;
  bool doc_mask = false;        // fill Batch::doc_ids and Batch::positions
  int prefetch = 2;             // batches produced ahead on a background thread; 0 = none
  bool verify = true;           // checksum every shard when opening
};

class Loader {
 public:
  explicit Loader(LoaderConfig cfg);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // This rank's rows of the next global micro-batch. Rethrows any error of the prefetch thread.
  void next(Batch& out);
  // Where the loader stands (after the last batch next() returned), as JSON.
  nlohmann::json state() const;
  // Continues from a state() of a loader over the same data, seed, T, mode and weights (B, dp rank
  // and dp size may differ). Fails naming the field that does not match.
  void restore(const nlohmann::json& state);
  // Back to the very first batch (each validation pass starts here).
  void rewind();

  double wait_seconds() const;
  uint32_t vocab_size() const { return datasets_[0]->vocab_size(); }
  // The tokenizer fingerprint the datasets record (equal wherever recorded), and the first dataset
  // recording it; "" when none does.
  std::string tokenizer_fingerprint() const;
  std::string tokenizer_source() const;
  int32_t eot_token() const { return int32_t(datasets_[0]->eot_token()); }
  uint64_t num_tokens() const;   // all datasets of this split
  uint64_t num_docs() const;     // documents of all datasets of this split
  uint64_t num_windows() const;  // all datasets; one epoch of a single dataset
  uint64_t position() const;     // global samples consumed so far
  uint64_t epoch() const;        // the epoch of dataset 0's stream the next sample comes from
  const LoaderConfig& config() const { return cfg_; }
  const Dataset& dataset(size_t k) const { return *datasets_[k]; }
  // Fails with a clear message unless the data's vocabulary is the model's (vocab_size).
  void check_model_vocab(int model_vocab) const;

 private:
  struct State {
    std::vector<uint64_t> consumed;  // per dataset: samples handed out so far
    uint64_t position() const;
  };
  struct Item {
    Batch batch;
    State after;
  };

  LoaderConfig cfg_;
  std::vector<std::unique_ptr<Dataset>> datasets_;
  std::unique_ptr<Sampler> sampler_;
  State state_;  // consumer side: after the last batch returned

  // Prefetch thread and its queue (guarded by mu_).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
  double wait_s_ = 0;

  // Produces the batch that follows `s` for this rank into `out`; returns the state after it.
  State produce(const State& s, Batch& out) const;
  void start_worker();
  void stop_worker();
};

}  // namespace mt::data
