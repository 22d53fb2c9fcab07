// Packing: turning windows of the EOT-joined token stream into training rows.
//
// A row is one window of T+1 stream tokens x[0..T]: inputs = x[0..T-1], targets = x[1..T]. Every
// next token is predicted, including the EOT that opens the following document (the model learns
// where documents end); no target is ignored by the packer. The value -1 is reserved for targets
// the loss must skip (ops::softmax_xent ignores targets < 0).
//
// Document masking (optional). Token t of the row carries
//   doc_ids[t]   = how many documents start inside the row at or before t (0 for the first,
//                  possibly partial, document; ids are local to the row);
//   positions[t] = t minus the row offset where that document starts in the row (0 for the first
//                  token of each document; a document cut by the window start counts from the
//                  window start, so positions stay < T).
// The attention op lets token i see token j iff j <= i and doc_ids[i] == doc_ids[j]; the encoder
// adds the position embedding of positions[t]. A document d that lies wholly inside a row, stored
// as [EOT, d_1 .. d_n] and followed by the next document's EOT, therefore sees exactly what it
// would see as a row of its own: inputs [EOT, d_1 .. d_n], targets [d_1 .. d_n, EOT], positions
// 0..n (single_document_row builds that reference row).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace mt::data {

// One micro-batch for one data-parallel rank. All arrays are row-major (B, T) int32.
struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> inputs;     // (B,T) token ids
  std::vector<int32_t> targets;    // (B,T) next token ids; -1 = ignore (never produced today)
  std::vector<int32_t> doc_ids;    // (B,T) only with document masking, else empty
  std::vector<int32_t> positions;  // (B,T) only with document masking, else empty (position = t)
  // Provenance of each row, for tests, logs and debugging: which dataset, epoch and window.
  std::vector<uint32_t> row_dataset;  // (B)
  std::vector<uint64_t> row_epoch;    // (B)
  std::vector<uint64_t> row_window;   // (B)

  void resize(int B, int T, bool doc_mask);
  const int32_t* doc_ids_or_null() const { return doc_ids.empty() ? nullptr : doc_ids.data(); }
  const int32_t* positions_or_null() const { return positions.empty() ? nullptr : positions.data(); }
};

// Fills one row from a window of T+1 tokens. `cuts` are the offsets j in (0, T+1) at which a
// document starts inside the window, ascending (offset T, a document starting at the last token,
// is allowed: it only affects targets). doc_ids/positions may be null (no masking).
void pack_row(int32_t* inputs, int32_t* targets, int32_t* doc_ids, int32_t* positions,
              std::span<const int32_t> window, std::span<const int> cuts, int T);

// The reference row of a document alone: inputs [EOT, d...], targets [d..., EOT], positions 0..n,
// doc ids 0 (length n+1). For tests of the promise above.
void single_document_row(std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                         std::vector<int32_t>& positions, std::span<const int32_t> doc, int32_t eot);

}  // namespace mt::data
