// What the trainer needs from the data pipeline: micro-batches of (B,T) int32 arrays and a resumable
// position. Implemented over data::Loader in train/batches.cpp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/options.h"
#include "data/packer.h"
#include "model/gpt.h"

namespace mt::train {

using HostBatch = data::Batch;
model::MicroBatch view(const HostBatch& b);
int valid_targets(const HostBatch& b);

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual void next(HostBatch& b) = 0;
  virtual nlohmann::json state() const = 0;
  virtual void restore(const nlohmann::json& s) = 0;
  virtual double wait_seconds() const = 0;  // cumulative time next() waited for data
  virtual int vocab_size() const = 0;
  virtual void rewind() = 0;  // back to the first batch (each evaluation reads the same batches)
  // The tokenizer fingerprint its datasets record and the first dataset recording it ("": none).
  virtual std::string tokenizer_fingerprint() const { return ""; }
  virtual std::string tokenizer_source() const { return ""; }
  virtual uint64_t num_tokens() const { return 0; }  // tokens in the data (0: endless, synthetic)
  virtual uint64_t num_docs() const { return 0; }    // documents in it (0: not known)
};

// Opens the training (split = "train") or validation ("val") stream described by the options, for
// data-parallel rank `dp_rank` of `dp_size`. Fails naming the file on any problem.
std::unique_ptr<BatchSource> open_batches(const config::TrainOptions& o, const std::string& split, int dp_rank, int dp_size);

// Context parallelism (--cp): the rows of `inner` each cp rank holds, T/cp tokens each (its 2 zigzag
// chunks), with global positions and document ids (parallel/ring_attention.h). cp = 1: `inner` itself.
std::unique_ptr<BatchSource> zigzag_batches(std::unique_ptr<BatchSource> inner, int cp, int cp_rank);

// Fails, naming both datasets and fingerprints, when the validation data records another tokenizer
// than the training data.
void check_same_tokenizer(const config::TrainOptions& o, const BatchSource& train, const BatchSource& val);

}  // namespace mt::train
