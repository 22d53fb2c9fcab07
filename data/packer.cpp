#include "data/packer.h"

#include "runtime/check.h"

namespace mt::data {

void Batch::resize(int B_, int T_, bool doc_mask) {
  B = B_;
  T = T_;
  size_t n = size_t(B_) * size_t(T_);
  inputs.resize(n);
  targets.resize(n);
  doc_ids.resize(doc_mask ? n : 0);
  positions.resize(doc_mask ? n : 0);
  row_dataset.resize(size_t(B_));
  row_epoch.resize(size_t(B_));
  row_window.resize(size_t(B_));
}

void pack_row(int32_t* inputs, int32_t* targets, int32_t* doc_ids, int32_t* positions,
              std::span<const int32_t> window, std::span<const int> cuts, int T) {
  MT_CHECK(window.size() == size_t(T) + 1, "a window of %zu tokens for T = %d", window.size(), T);
  for (int t = 0; t < T; t++) {
    inputs[t] = window[size_t(t)];
    targets[t] = window[size_t(t) + 1];
  }
  if (!doc_ids && !positions) return;
  int doc = 0, start = 0;
  size_t c = 0;
  for (int t = 0; t < T; t++) {
    // Advance past every cut at or before t (cuts are ascending and > 0).
    while (c < cuts.size() && cuts[c] <= t) {
      MT_CHECK(cuts[c] > 0 && (c == 0 || cuts[c] > cuts[c - 1]), "document cuts must ascend from 1");
      start = cuts[c++];
      doc++;
    }
    if (doc_ids) doc_ids[t] = doc;
    if (positions) positions[t] = t - start;
  }
}

void single_document_row(std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                         std::vector<int32_t>& positions, std::span<const int32_t> doc, int32_t eot) {
  size_t n = doc.size();
  inputs.assign(1, eot);
  inputs.insert(inputs.end(), doc.begin(), doc.end());
  targets.assign(doc.begin(), doc.end());
  targets.push_back(eot);
  positions.resize(n + 1);
  for (size_t t = 0; t <= n; t++) positions[t] = int32_t(t);
}

}  // namespace mt::data
