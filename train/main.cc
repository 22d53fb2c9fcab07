// The minitrain command line:
//   minitrain train  [--config f.json] [key=value ...] [--flag value ...]
//   minitrain bench  [same options] [warmup=N]
//   minitrain sample --model run/model.safetensors (--text "..." --tokenizer tok.json | --prompt 1,2,3)
//                    [--tokens N --temperature T --top_k K --seed S]
//   minitrain data   prepare|inspect ...
//   minitrain plan   [train options] [hw=h100|h200|a100|cpu|FILE] [gpus=N] [tokens=N] [--json] [--search]
//   minitrain bench  --calibrate [out=FILE]: a hardware file for plan, measured on this machine
//   minitrain <command> --help (or -h): the command's options; minitrain --version: version and build
// Errors print one line `minitrain: error: ...` and exit with status 1 (2 for a missing command).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "data/prepare.h"
#include "data/tokenizer.h"
#include "checkpoint/checkpoint.h"
#include "parallel/launch.h"
#include "runtime/check.h"
#include "train/bench.h"
#include "train/options_help.h"
#include "train/plan.h"
#include "train/sample.h"
#include "train/selftest.h"
#include "train/trainer.h"

namespace {

const char* kUsage =
    "usage: minitrain <command> [options]    (minitrain <command> --help: its options; --version)\n"
    "  train   train a GPT (key=value options, --config file.json; see README)\n"
    "  bench   time training steps on synthetic tokens and print a table; --calibrate [out=FILE]: measure\n"
    "          this machine (GEMM rate, memory bandwidth, MPI latency/bandwidth) as a hardware file for plan\n"
    "  sample  generate tokens from a trained model.safetensors\n"
    "  selftest  check every CUDA op against its CPU twin (--device cuda [--seed S])\n"
    "  ckpt    ls <root> | verify <checkpoint, root or root/latest> | export <checkpoint or root> <out.safetensors> [--all]\n"
    "  data    prepare | inspect token shards\n"
    "  plan    [train options] [hw=h100|h200|a100|cpu|FILE] [gpus=N] [tokens=N] [--json] [--search]:\n"
    "          per-rank memory by category, FLOPs, bytes per group, pipeline grid and bubble, predicted\n"
    "          step time and MFU; --search ranks the layouts that fit\n";

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    char* end = nullptr;
    long v = std::strtol(tok.c_str(), &end, 10);
    if (tok.empty() || *end) mt::fail("--prompt must be comma-separated token ids (bad item '%s')", tok.c_str());
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
  const mt::train::SampleOptions d;
  for (const SampleFlag& f : kSampleFlags) {
    const std::string name = f.name;
    const std::string def = f.default_value                ? f.default_value
                            : name == "--tokens"           ? std::to_string(d.max_new_tokens)
                            : name == "--temperature"      ? mt::strfmt("%g", d.temperature)
                            : name == "--top_k"            ? std::to_string(d.top_k)
                                                           : std::to_string(d.seed);
    s += mt::strfmt("  %-14s %-7s %-11s %s\n", f.name, f.type, def.c_str(), f.meaning);
  }
  return s;
}

int sample_main(const std::vector<std::string>& args) {
  if (mt::train::wants_help(args)) {
    std::fputs(sample_help().c_str(), stdout);
    return 0;
  }
  mt::train::SampleOptions o;
  std::string text, tokenizer_path;
  for (size_t i = 0; i < args.size(); i++) {
    std::string a = args[i];
    if (a == "--top-k") a = "--top_k";
    bool known = false;
    for (const SampleFlag& f : kSampleFlags) known |= a == f.name;
    if (!known) mt::fail("unknown sample flag '%s' (see minitrain sample --help)", a.c_str());
    if (i + 1 >= args.size()) mt::fail("flag %s needs a value", a.c_str());
    const std::string& v = args[++i];
    if (a == "--model") o.model_path = v;
    else if (a == "--prompt") o.prompt = parse_ids(v);
    else if (a == "--text") text = v;
    else if (a == "--tokenizer") tokenizer_path = v;
    else if (a == "--tokens") o.max_new_tokens = mt::train::parse_int(a, v);
    else if (a == "--temperature") o.temperature = float(mt::train::parse_number(a, v));
    else if (a == "--top_k") o.top_k = mt::train::parse_int(a, v);
    else if (a == "--seed") o.seed = mt::train::parse_u64(a, v);
    else MT_CHECK(false, "sample flag %s is in the table but not parsed", a.c_str());
  }
  if (o.model_path.empty()) mt::fail("sample needs --model <model.safetensors>");
  if (!text.empty() && tokenizer_path.empty()) mt::fail("sample: --text needs --tokenizer <tokenizer.json>");
  if (!text.empty() && !o.prompt.empty()) mt::fail("sample: give either --text or --prompt, not both");
  if (tokenizer_path.empty()) {
    const std::vector<int32_t> out = mt::train::sample_tokens(o);
    for (size_t i = 0; i < out.size(); i++) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
    return 0;
  }
  const mt::data::Tokenizer tok = mt::data::Tokenizer::load_any(tokenizer_path);
  // Generation starts after an end-of-text token, as every training document does.
  o.prompt.insert(o.prompt.begin(), tok.eot_token());
  const std::vector<int32_t> p = tok.encode(text);
  o.prompt.insert(o.prompt.end(), p.begin(), p.end());
  o.stop_token = tok.eot_token();  // one document: stop where the model ends it
  o.vocab_limit = tok.vocab_size();
  std::vector<int32_t> out = mt::train::sample_tokens(o);
  if (out.back() == tok.eot_token()) out.pop_back();
  const std::string decoded = tok.decode(std::span<const int32_t>(out).subspan(1)) + "\n";
  std::fwrite(decoded.data(), 1, decoded.size(), stdout);  // byte for byte, NULs included
  return 0;
}

// `ckpt export <checkpoint> <out.safetensors> [--all]`: the master weights of a checkpoint, whatever
// layout wrote it, as one HF-named safetensors file (with --all also the AdamW moments, under their
// checkpoint names). ls and verify come from the checkpoint library.
int ckpt_main(int argc, char** argv) {
  if (argc >= 1 && std::string(argv[0]) == "export") {
    if (argc < 3 || argc > 4 || (argc == 4 && std::string(argv[3]) != "--all"))
      mt::fail("usage: minitrain ckpt export <checkpoint, root or root/latest> <out.safetensors> [--all]");
    mt::train::export_checkpoint(mt::checkpoint::resolve_checkpoint(argv[1]), argv[2], argc == 4);
    return 0;
  }
  return mt::checkpoint::ckpt_cli(argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "--version" || cmd == "-V") {
    std::fputs(mt::train::version_text().c_str(), stdout);
    return 0;
  }
  if ((cmd == "train" || cmd == "bench") && mt::train::wants_help(args)) {
    std::fputs(mt::train::train_help(cmd).c_str(), stdout);
    return 0;
  }
  try {
    if (cmd == "train") {
      // Under mpirun every rank runs this; an error on any rank ends the whole job (run_main).
      mt::parallel::World world(&argc, &argv);
      return mt::parallel::run_main(world, [&](mt::parallel::World& w) {
        // Options and setup fail the same way on every rank (same arguments, same files): report
        // such an error once. A rank whose error was its own still reports it after a grace period.
        std::unique_ptr<mt::train::Trainer> t;
        try {
          t = std::make_unique<mt::train::Trainer>(mt::train::parse_train_options(args), &w.comm(), w.local_rank());
        } catch (const mt::parallel::CollectiveError&) {
          throw;
        } catch (const mt::Error& e) {
          throw mt::parallel::CollectiveError(e.what());
        }
        t->run();
        return 0;
      });
    }
    if (cmd == "bench") {
      mt::parallel::World world(&argc, &argv);
      return mt::parallel::run_main(world, [&](mt::parallel::World& w) { return mt::train::bench_main(args, &w.comm(), w.local_rank()); });
    }
    if (cmd == "sample") return sample_main(args);
    if (cmd == "selftest") return mt::train::selftest_main(args);
    if (cmd == "ckpt") return ckpt_main(argc - 2, argv + 2);
    if (cmd == "data") return mt::data::data_cli(argc - 2, argv + 2);
    if (cmd == "plan") return mt::train::plan_main(args);
    mt::fail("unknown command '%s'\n%s", cmd.c_str(), kUsage);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minitrain: error: %s\n", e.what());
    return 1;
  }
}
