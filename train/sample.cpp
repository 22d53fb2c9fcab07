#include "train/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/gpt.h"
#include "model/hf_io.h"
#include "runtime/check.h"
#include "runtime/safetensors.h"

namespace mt::train {

namespace {
// xorshift64*: a tiny, fully specified generator, so samples are reproducible everywhere.
double next_uniform(uint64_t& s) {
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return double((s * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
}
}  // namespace

int32_t sample_from_logits(const float* logits, int V, float temperature, int top_k, uint64_t& rng) {
  if (temperature <= 0.f) return int32_t(std::max_element(logits, logits + V) - logits);
  std::vector<int> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  int k = (top_k > 0 && top_k < V) ? top_k : V;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double mx = logits[idx[0]];
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0;
  for (int i = 0; i < k; i++) sum += p[size_t(i)] = std::exp((double(logits[idx[size_t(i)]]) - mx) / temperature);
  double u = next_uniform(rng) * sum;
  for (int i = 0; i < k; i++) {
    u -= p[size_t(i)];
    if (u <= 0) return idx[size_t(i)];
  }
  return idx[size_t(k - 1)];
}

std::vector<int32_t> sample_tokens(const SampleOptions& o) {
  const SafetensorsFile f = SafetensorsFile::read(o.model_path);
  auto it = f.metadata().find("minitrain_config");
  if (it == f.metadata().end())
    fail("%s has no minitrain_config metadata (was it written by minitrain train?)", o.model_path.c_str());
  const model::GPTConfig cfg = model::GPTConfig::from_json(nlohmann::json::parse(it->second));
  if (o.prompt.empty()) fail("sample: the prompt is empty");
  for (int32_t t : o.prompt)
    if (t < 0 || t >= cfg.vocab_size) fail("sample: prompt token %d is outside the vocabulary (%d)", t, cfg.vocab_size);
  if (o.max_new_tokens < 0) fail("--tokens must not be negative");
  Arena arena;
  ParamStore store;
  model::GPT gpt(cfg, store);
  store.finalize(arena, DType::f32);
  model::import_hf(gpt, store, o.model_path);
  gpt.set_arena(&arena);
  std::vector<int32_t> seq = o.prompt;
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  // A model's vocabulary may be larger than its tokenizer's (rounded up, or set by hand); the ids past
  // the tokenizer's have no text, so they are never drawn.
  const int V = o.vocab_limit > 0 ? std::min(o.vocab_limit, cfg.vocab_size) : cfg.vocab_size;
  uint64_t rng = o.seed * 0x9E3779B97F4A7C15ULL + 1;
  for (int i = 0; i < o.max_new_tokens; i++) {
    // The context is the last block_size tokens (no KV cache: recomputed each step, fine for demos).
    const int T = std::min<int>(int(seq.size()), cfg.block_size);
    model::MicroBatch mb;
    mb.B = 1;
    mb.T = T;
    mb.tokens = seq.data() + (seq.size() - size_t(T));
    gpt.forward_last_logits(mb, logits.data());
    seq.push_back(sample_from_logits(logits.data(), V, o.temperature, o.top_k, rng));
    if (seq.back() == o.stop_token) break;
  }
  return seq;
}

}  // namespace mt::train
