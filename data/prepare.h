// `minitrain data prepare` and `minitrain data inspect` as library functions.
//
// prepare: inputs -> documents -> (trained or loaded) byte-level BPE -> token shards in out_dir:
//   out_dir/tokenizer.json         the tokenizer the shards were made with (our JSON format)
//   out_dir/train_000000.bin ...   training shards (docs/data_format.md)
//   out_dir/val_000000.bin ...     the held-out split
//   out_dir/meta.json              the manifest, written last: shard lists, totals, and a fingerprint
//                                  of the inputs (path, size, mtime) and options
// Re-running with the same inputs and options finds a matching meta.json and reuses the shards;
// a matching tokenizer.json is reused even when the shards are rebuilt. Every file is written under
// a temporary name and renamed, and meta.json is removed before and rewritten after a rebuild, so an
// interrupted run never leaves a directory that looks complete.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/documents.h"
#include "runtime/log.h"

namespace mt::data {

struct PrepareOptions {
  std::vector<std::string> inputs;       // files, directories, globs
  std::string out_dir;
  Splitter splitter = Splitter::file;
  std::string tokenizer;                 // load this tokenizer (ours or GPT-2's); empty: train one
  int vocab_size = 4096;                 // when training
  uint64_t tokenizer_sample_bytes = uint64_t(256) << 20;  // train on the first this-many bytes of documents
  uint64_t shard_tokens = uint64_t(1) << 26;              // start a new shard beyond this many tokens
  double val_fraction = 0.01;            // share of documents held out (at least one when > 0)
  int threads = 0;                       // 0: all cores (OpenMP default)
  bool force = false;                    // rebuild even if the output matches
};

struct PrepareReport {
  bool reused = false;
  int vocab_size = 0, eot_token = 0;
  uint64_t files = 0, bytes = 0;
  uint64_t train_docs = 0, val_docs = 0, train_tokens = 0, val_tokens = 0;
  size_t train_shards = 0, val_shards = 0;
  double seconds = 0;           // whole run
  double tokenize_seconds = 0;  // wall time of the parallel encoding
  double tokenize_mb_per_s() const { return tokenize_seconds > 0 ? bytes / 1e6 / tokenize_seconds : 0; }
};

// Fails (mt::Error naming the flag or file) on bad options, unreadable or empty input.
PrepareReport prepare_dataset(const PrepareOptions& opt, const Logger& log);

// Prints a shard's header, counts, document-length statistics and the first `sample_tokens` tokens
// decoded with `tokenizer` (default: tokenizer.json beside the shard; ids only if there is none).
// Verifies the shard fully; fails on a damaged shard or a tokenizer whose vocab differs.
void inspect_shard(const std::string& path, const std::string& tokenizer, int sample_tokens, FILE* out);

// The CLI of both: argv[0] is "prepare" or "inspect" (as after `minitrain data`). Prints usage for
// --help, one line naming the flag or file on any error; returns the process exit code.
int data_cli(int argc, char** argv);

}  // namespace mt::data
