#include "cli/sample.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <span>

#include "cli/help.h"
#include "config/options.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "model/hf_io.h"
#include "runtime/check.h"
#include "runtime/safetensors.h"

namespace mt::cli {

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

namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    char* end = nullptr;
    long v = std::strtol(tok.c_str(), &end, 10);
    if (tok.empty() || *end) fail("--prompt must be comma-separated token ids (bad item '%s')", tok.c_str());
    ids.push_back(int32_t(v));
    i = j + 1;
  }
  return ids;
}

// The flags of `minitrain sample`: the parser accepts exactly these, and --help lists them.
struct SampleFlag {
  const char* name;
  const char* type;
  const char* default_value;  // nullptr: SampleOptions{}'s (sample_help)
  const char* meaning;
};
constexpr SampleFlag kSampleFlags[] = {
    {"--model", "path", "(required)", "model.safetensors written by a run (or ckpt export)"},
    {"--tokenizer", "path", "''", "tokenizer.json of the data the model was trained on (needed by --text)"},
    {"--text", "string", "''", "prompt text (with --tokenizer); the output is decoded text"},
    {"--prompt", "ids", "''", "prompt as comma-separated token ids; the output is token ids"},
    {"--tokens", "int", nullptr, "new tokens to generate"},
    {"--temperature", "number", nullptr, "softmax temperature (0: greedy)"},
    {"--top_k", "int", nullptr, "sample among the k likeliest tokens (0: all); also --top-k"},
    {"--seed", "int", nullptr, "sampling seed"},
};

std::string sample_help() {
  std::string s = "usage: minitrain sample --model M.safetensors (--tokenizer T.json --text \"...\" | --prompt 1,2,3) [flags]\n";
  const SampleOptions d;
  for (const SampleFlag& f : kSampleFlags) {
    const std::string name = f.name;
    const std::string def = f.default_value                ? f.default_value
                            : name == "--tokens"           ? std::to_string(d.max_new_tokens)
                            : name == "--temperature"      ? strfmt("%g", d.temperature)
                            : name == "--top_k"            ? std::to_string(d.top_k)
                                                           : std::to_string(d.seed);
    s += strfmt("  %-14s %-7s %-11s %s\n", f.name, f.type, def.c_str(), f.meaning);
  }
  return s;
}

}  // namespace

int sample_main(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(sample_help().c_str(), stdout);
    return 0;
  }
  SampleOptions o;
  std::string text, tokenizer_path;
  for (size_t i = 0; i < args.size(); i++) {
    std::string a = args[i];
    if (a == "--top-k") a = "--top_k";
    bool known = false;
    for (const SampleFlag& f : kSampleFlags) known |= a == f.name;
    if (!known) fail("unknown sample flag '%s' (see minitrain sample --help)", a.c_str());
    if (i + 1 >= args.size()) fail("flag %s needs a value", a.c_str());
    const std::string& v = args[++i];
    if (a == "--model") o.model_path = v;
    else if (a == "--prompt") o.prompt = parse_ids(v);
    else if (a == "--text") text = v;
    else if (a == "--tokenizer") tokenizer_path = v;
    else if (a == "--tokens") o.max_new_tokens = config::parse_int(a, v);
    else if (a == "--temperature") o.temperature = float(config::parse_number(a, v));
    else if (a == "--top_k") o.top_k = config::parse_int(a, v);
    else if (a == "--seed") o.seed = config::parse_u64(a, v);
    else MT_CHECK(false, "sample flag %s is in the table but not parsed", a.c_str());
  }
  if (o.model_path.empty()) fail("sample needs --model <model.safetensors>");
  if (!text.empty() && tokenizer_path.empty()) fail("sample: --text needs --tokenizer <tokenizer.json>");
  if (!text.empty() && !o.prompt.empty()) fail("sample: give either --text or --prompt, not both");
  if (tokenizer_path.empty()) {
    const std::vector<int32_t> out = sample_tokens(o);
    for (size_t i = 0; i < out.size(); i++) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
    return 0;
  }
  const data::Tokenizer tok = data::Tokenizer::load_any(tokenizer_path);
  // Generation starts after an end-of-text token, as every training document does.
  o.prompt.insert(o.prompt.begin(), tok.eot_token());
  const std::vector<int32_t> p = tok.encode(text);
  o.prompt.insert(o.prompt.end(), p.begin(), p.end());
  o.stop_token = tok.eot_token();  // one document: stop where the model ends it
  o.vocab_limit = tok.vocab_size();
  std::vector<int32_t> out = sample_tokens(o);
  if (out.back() == tok.eot_token()) out.pop_back();
  const std::string decoded = tok.decode(std::span<const int32_t>(out).subspan(1)) + "\n";
  std::fwrite(decoded.data(), 1, decoded.size(), stdout);  // byte for byte, NULs included
  return 0;
}

}  // namespace mt::cli
