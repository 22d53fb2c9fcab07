// `minitrain data prepare|inspect`: flag parsing and the inspect printout.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "runtime/check.h"

namespace mt::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: minitrain data prepare --input <file|dir|glob>... --out <dir> [options]\n"
    "  --splitter file|lines|paragraphs|fortune|jsonl   how files split into documents (file)\n"
    "  --vocab N              train a byte-level BPE of N tokens (4096)\n"
    "  --tokenizer PATH       use this tokenizer instead: our tokenizer.json, a GPT-2 vocab.json\n"
    "                         (merges.txt beside it) or a directory holding either\n"
    "  --tokenizer-sample-mb N   train the tokenizer on the first N MB of documents (256)\n"
    "  --shard-tokens N       tokens per shard (67108864)\n"
    "  --val-fraction F       share of documents held out for validation (0.01)\n"
    "  --threads N            encoding threads (all cores)\n"
    "  --force                rebuild even if the output is up to date\n"
    "       minitrain data inspect <shard.bin> [--tokenizer PATH] [--sample N]\n";

uint64_t parse_u64(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || v[0] == '-')
    fail("%s: '%s' is not a non-negative integer", flag.c_str(), v.c_str());
  return x;
}

int parse_int(const std::string& flag, const std::string& v) {
  uint64_t x = parse_u64(flag, v);
  if (x > uint64_t(1) << 30) fail("%s: %s is too large", flag.c_str(), v.c_str());
  return int(x);
}

double parse_double(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') fail("%s: '%s' is not a number", flag.c_str(), v.c_str());
  return x;
}

// Splits "--flag=value" and "--flag value"; multi-valued flags take values up to the next "--".
struct Args {
  std::vector<std::pair<std::string, std::vector<std::string>>> flags;
  std::vector<std::string> positional;
};

Args parse_args(int argc, char** argv, const std::vector<std::string>& multi, const std::vector<std::string>& bools) {
  Args a;
  for (int i = 1; i < argc; i++) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) {
      a.positional.push_back(s);
      continue;
    }
    std::string name = s, value;
    bool inline_value = false;
    if (size_t eq = s.find('='); eq != std::string::npos) {
      name = s.substr(0, eq);
      value = s.substr(eq + 1);
      inline_value = true;
    }
    std::vector<std::string> values;
    bool is_bool = std::find(bools.begin(), bools.end(), name) != bools.end();
    if (inline_value) {
      values.push_back(value);
    } else if (!is_bool) {
      bool is_multi = std::find(multi.begin(), multi.end(), name) != multi.end();
      while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        values.emplace_back(argv[++i]);
        if (!is_multi) break;
      }
      if (values.empty()) fail("%s: missing value", name.c_str());
    }
    a.flags.emplace_back(name, values);
  }
  return a;
}

int cli_prepare(int argc, char** argv) {
  Args a = parse_args(argc, argv, {"--input"}, {"--force", "--help"});
  PrepareOptions o;
  for (auto& [f, v] : a.flags) {
    if (f == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (f == "--input") {
      o.inputs.insert(o.inputs.end(), v.begin(), v.end());
    } else if (f == "--out") {
      o.out_dir = v[0];
    } else if (f == "--splitter") {
      o.splitter = splitter_from_name(v[0]);
    } else if (f == "--vocab") {
      o.vocab_size = parse_int(f, v[0]);
    } else if (f == "--tokenizer") {
      o.tokenizer = v[0];
    } else if (f == "--tokenizer-sample-mb") {
      o.tokenizer_sample_bytes = parse_u64(f, v[0]) << 20;
    } else if (f == "--shard-tokens") {
      o.shard_tokens = parse_u64(f, v[0]);
    } else if (f == "--val-fraction") {
      o.val_fraction = parse_double(f, v[0]);
    } else if (f == "--threads") {
      o.threads = parse_int(f, v[0]);
    } else if (f == "--force") {
      o.force = true;
    } else {
      fail("unknown flag %s (see --help)", f.c_str());
    }
  }
  if (!a.positional.empty()) fail("unexpected argument '%s' (inputs go after --input)", a.positional[0].c_str());
  Logger log;
  PrepareReport r = prepare_dataset(o, log);
  std::string speed = r.reused ? "reused, nothing tokenized" : strfmt("tokenized at %.1f MB/s", r.tokenize_mb_per_s());
  std::printf("%s: %llu documents (%llu train, %llu val), %llu tokens (%llu train, %llu val), vocab %d, "
              "%zu + %zu shards, %.2f MB of text, %s\n",
              o.out_dir.c_str(), (unsigned long long)(r.train_docs + r.val_docs), (unsigned long long)r.train_docs,
              (unsigned long long)r.val_docs, (unsigned long long)(r.train_tokens + r.val_tokens),
              (unsigned long long)r.train_tokens, (unsigned long long)r.val_tokens, r.vocab_size, r.train_shards,
              r.val_shards, r.bytes / 1e6, speed.c_str());
  std::fflush(stdout);
  return 0;
}

int cli_inspect(int argc, char** argv) {
  Args a = parse_args(argc, argv, {}, {"--help"});
  std::string tokenizer;
  int sample = 64;
  for (auto& [f, v] : a.flags) {
    if (f == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (f == "--tokenizer") {
      tokenizer = v[0];
    } else if (f == "--sample") {
      sample = parse_int(f, v[0]);
    } else {
      fail("unknown flag %s (see --help)", f.c_str());
    }
  }
  if (a.positional.size() != 1) fail("inspect takes exactly one shard file (got %zu)", a.positional.size());
  inspect_shard(a.positional[0], tokenizer, sample, stdout);
  return 0;
}

}  // namespace

void inspect_shard(const std::string& path, const std::string& tokenizer, int sample_tokens, FILE* out) {
  Shard sh(path, true);
  const ShardHeader& h = sh.header();
  std::fprintf(out, "shard        %s\n", path.c_str());
  std::fprintf(out, "format       MTTOKENS version %u, %u-byte tokens, %llu bytes\n", h.version, h.token_bytes,
               (unsigned long long)shard_file_bytes(h));
  std::fprintf(out, "vocab        %u (end-of-text id %u)\n", h.vocab_size, h.eot_token);
  std::fprintf(out, "tokens       %llu\n", (unsigned long long)h.num_tokens);
  std::fprintf(out, "documents    %llu\n", (unsigned long long)h.num_docs);
  std::fprintf(out, "checksums    header %08x ok, data %08x ok, all ids < vocab\n", h.header_crc, h.data_crc);
  if (h.num_docs > 0) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint64_t i = 0; i < h.num_docs; i++) {
      uint64_t end = i + 1 < h.num_docs ? sh.doc_starts()[i + 1] : h.num_tokens;
      uint64_t len = end - sh.doc_starts()[i];
      lo = std::min(lo, len);
      hi = std::max(hi, len);
    }
    std::fprintf(out, "doc length   min %llu, mean %.1f, max %llu tokens (with the leading end-of-text)\n",
                 (unsigned long long)lo, double(h.num_tokens) / double(h.num_docs), (unsigned long long)hi);
  }
  std::optional<Tokenizer> tok;
  std::string tok_path = tokenizer;
  if (tok_path.empty()) {
    fs::path beside = fs::path(path).parent_path() / "tokenizer.json";
    if (fs::exists(beside)) tok_path = beside.string();
  }
  if (!tok_path.empty()) {
    tok = Tokenizer::load_any(tok_path);
    if (uint32_t(tok->vocab_size()) != h.vocab_size || uint32_t(tok->eot_token()) != h.eot_token)
      fail("%s: tokenizer %s (vocab %d, end-of-text %d) does not match the shard (vocab %u, end-of-text %u)",
           path.c_str(), tok_path.c_str(), tok->vocab_size(), tok->eot_token(), h.vocab_size, h.eot_token);
  }
  uint64_t n = std::min<uint64_t>(h.num_tokens, uint64_t(std::max(0, sample_tokens)));
  std::vector<int32_t> ids(n);
  sh.read(0, n, ids.data());
  if (tok) {
    std::fprintf(out, "sample       first %llu tokens, decoded with %s:\n", (unsigned long long)n, tok_path.c_str());
    std::string text = tok->decode(ids);
    text += '\n';
    std::fwrite(text.data(), 1, text.size(), out);  // the decoded bytes as they are, NULs included
  } else {
    std::fprintf(out, "sample       first %llu token ids (no tokenizer.json beside the shard):\n",
                 (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) std::fprintf(out, "%d%c", ids[i], i + 1 == n ? '\n' : ' ');
  }
}

int data_cli(int argc, char** argv) {
  std::string cmd = argc > 0 ? argv[0] : "";
  for (int i = 0; i < argc; i++)  // -h or --help anywhere: the usage of both subcommands
    if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  try {
    if (cmd == "prepare") return cli_prepare(argc, argv);
    if (cmd == "inspect") return cli_inspect(argc, argv);
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "minitrain data: unknown subcommand '%s' (prepare | inspect)\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minitrain data %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}

}  // namespace mt::data
