// Tokenizer::train: learning BPE merges from a corpus (Sennrich et al. 2016, byte-level).
//
// The corpus is reduced to distinct pre-tokenized pieces ("words") with their counts; merges never
// cross a piece. Each round merges the most frequent adjacent pair (ties: the smaller (left, right)
// ids, so training is deterministic), and only the words that contain it are rewritten: their pair
// counts are subtracted, the merge applied, and the counts added back. A max-heap with lazy deletion
// finds the best pair; an inverted index pair -> words (may hold stale entries) finds the words.
#include <omp.h>

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "data/pretokenize.h"
#include "data/tokenizer.h"
#include "runtime/check.h"

namespace mt::data {

namespace {

constexpr size_t kMaxTrainPieceBytes = 256;

uint64_t key_of(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

struct Word {
  std::vector<int32_t> sym;
  int64_t count;
};

// Distinct pieces and their counts, counted on all threads, returned sorted by bytes so the result
// does not depend on the thread count or hash order.
std::vector<std::pair<std::string, int64_t>> count_pieces(std::span<const std::string> texts) {
  int nt = omp_get_max_threads();
  std::vector<std::unordered_map<std::string_view, int64_t>> local{size_t(nt)};
#pragma omp parallel
  {
    auto& m = local[size_t(omp_get_thread_num())];
    std::vector<std::string_view> pieces;
#pragma omp for schedule(dynamic, 16)
    for (size_t i = 0; i < texts.size(); i++) {
      pieces.clear();
      pretokenize(texts[i], pieces);
      for (std::string_view p : pieces)
        if (p.size() <= kMaxTrainPieceBytes) m[p]++;
    }
  }
  std::unordered_map<std::string_view, int64_t> all;
  for (auto& m : local)
    for (auto& [k, v] : m) all[k] += v;
  std::vector<std::pair<std::string, int64_t>> out;
  out.reserve(all.size());
  for (auto& [k, v] : all) out.emplace_back(std::string(k), v);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Tokenizer Tokenizer::train(std::span<const std::string> texts, int vocab_size, const Logger* log) {
  if (vocab_size < 257) fail("tokenizer vocab size %d is too small (at least 257: 256 bytes + end-of-text)", vocab_size);
  const int max_merges = vocab_size - 257;

  std::vector<Word> words;
  for (auto& [s, c] : count_pieces(texts)) {
    Word w;
    w.count = c;
    for (unsigned char b : s) w.sym.push_back(int32_t(b));
    if (w.sym.size() >= 2) words.push_back(std::move(w));
  }

  std::unordered_map<uint64_t, int64_t> counts;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;
  for (size_t wi = 0; wi < words.size(); wi++) {
    const Word& w = words[wi];
    for (size_t i = 0; i + 1 < w.sym.size(); i++) {
      uint64_t k = key_of(w.sym[i], w.sym[i + 1]);
      counts[k] += w.count;
      auto& v = where[k];
      if (v.empty() || v.back() != int32_t(wi)) v.push_back(int32_t(wi));
    }
  }
  // Max-heap on (count, -key): most frequent first, then the smallest (left, right).
  using Entry = std::pair<int64_t, uint64_t>;
  auto less = [](const Entry& a, const Entry& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(less)> heap(less);
  for (auto& [k, c] : counts) heap.push({c, k});

  std::vector<Merge> merges;
  std::vector<int32_t> touched_at(words.size(), -1);
  std::unordered_set<uint64_t> changed;
  while (int(merges.size()) < max_merges && !heap.empty()) {
    auto [c, k] = heap.top();
    heap.pop();
    auto it = counts.find(k);
    if (it == counts.end() || it->second != c) continue;  // stale entry
    if (c < 2) break;  // merging a pair seen once memorises, it does not compress
    int32_t a = int32_t(k >> 32), b = int32_t(uint32_t(k)), id = int32_t(256 + merges.size());
    merges.push_back({a, b, id});
    changed.clear();
    std::vector<int32_t> users = std::move(where[k]);
    where.erase(k);
    for (int32_t wi : users) {
      if (touched_at[size_t(wi)] == id) continue;
      touched_at[size_t(wi)] = id;
      Word& w = words[size_t(wi)];
      bool has = false;
      for (size_t i = 0; i + 1 < w.sym.size() && !has; i++) has = w.sym[i] == a && w.sym[i + 1] == b;
      if (!has) continue;  // stale index entry
      for (size_t i = 0; i + 1 < w.sym.size(); i++) {
        uint64_t p = key_of(w.sym[i], w.sym[i + 1]);
        counts[p] -= w.count;
        changed.insert(p);
      }
      size_t j = 0;
      for (size_t i = 0; i < w.sym.size(); j++) {
        if (i + 1 < w.sym.size() && w.sym[i] == a && w.sym[i + 1] == b) {
          w.sym[j] = id;
          i += 2;
        } else {
          w.sym[j] = w.sym[i++];
        }
      }
      w.sym.resize(j);
      for (size_t i = 0; i + 1 < w.sym.size(); i++) {
        uint64_t p = key_of(w.sym[i], w.sym[i + 1]);
        counts[p] += w.count;
        changed.insert(p);
        if (w.sym[i] == id || w.sym[i + 1] == id) {
          auto& v = where[p];
          if (v.empty() || v.back() != wi) v.push_back(wi);
        }
      }
    }
    counts.erase(k);
    for (uint64_t p : changed) {
      auto ci = counts.find(p);
      if (ci == counts.end()) continue;
      if (ci->second <= 0) {
        counts.erase(ci);
        where.erase(p);
      } else {
        heap.push({ci->second, p});
      }
    }
    if (log && (merges.size() % 4096 == 0))
      MT_LOG_INFO(*log, "tokenizer: %zu / %d merges (last pair seen %lld times)", merges.size(), max_merges,
                  (long long)c);
  }
  std::array<int32_t, 256> byte_ids{};
  for (int b = 0; b < 256; b++) byte_ids[size_t(b)] = b;
  int v = int(257 + merges.size());
  if (log && v < vocab_size)
    MT_LOG_WARN(*log, "tokenizer: the corpus supports only %zu merges; vocab size is %d, not %d", merges.size(), v,
                vocab_size);
  return Tokenizer(byte_ids, std::move(merges), v - 1, v, "trained tokenizer");
}

}  // namespace mt::data
