// The minitrain command line: one X_main per command (cli/, plan/cli.cpp, data/cli.cpp), chosen here.
//   minitrain train  [--config f.json] [key=value ...] [--flag value ...]
//   minitrain bench  [same options] [warmup=N]
//   minitrain sample --model run/model.safetensors (--text "..." --tokenizer tok.json | --prompt 1,2,3)
//                    [--tokens N --temperature T --top_k K --seed S]
//   minitrain data   prepare|inspect ...
//   minitrain plan   [train options] [hw=h100|h200|a100|cpu|FILE] [gpus=N] [tokens=N] [--json] [--search]
//   minitrain bench  --calibrate [out=FILE]: a hardware file for plan, measured on this machine
//   minitrain plot   RUN [RUN ...] [--out DIR]: scripts/plot.py, found beside the binary (cli/plot.h)
//   minitrain <command> --help (or -h): the command's options; minitrain --version: version and build
// Errors print one line `minitrain: error: ...` and exit with status 1 (2 for a missing command);
// `train` exits with the statuses of runtime/exit_status.h (2: refused before the first step, 3:
// diverged, 4: hung, 5: preempted); `plan` exits 2 when it refuses (plan/plan.h plan_main).
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli/bench.h"
#include "cli/ckpt.h"
#include "cli/help.h"
#include "cli/plot.h"
#include "cli/sample.h"
#include "cli/selftest.h"
#include "data/prepare.h"
#include "parallel/launch.h"
#include "plan/plan.h"
#include "runtime/check.h"
#include "runtime/exit_status.h"
#include "runtime/preempt.h"
#include "train/preflight.h"
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
    "  plot    RUN [RUN ...] [--out DIR]: plots of runs' metrics (loss, throughput, memory, ...) as PNGs\n"
    "  plan    [train options] [hw=h100|h200|a100|cpu|FILE] [gpus=N] [tokens=N] [--json] [--search]:\n"
    "          per-rank memory by category, FLOPs, bytes per group, pipeline grid and bubble, predicted\n"
    "          step time and MFU; --search ranks the layouts that fit\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "--version" || cmd == "-V") {
    std::fputs(mt::cli::version_text().c_str(), stdout);
    return 0;
  }
  if ((cmd == "train" || cmd == "bench") && mt::cli::wants_help(args)) {
    std::fputs(mt::cli::train_help(cmd).c_str(), stdout);
    return 0;
  }
  try {
    if (cmd == "train") {
      // Under mpirun every rank runs this; an error on any rank ends the whole job (run_main).
      // A stop asked for while MPI starts (mpirun passes SIGUSR1 on as soon as the ranks exist) is
      // kept for the first step boundary instead of killing the rank: handlers first, deadline later.
      mt::install_preemption_handlers(0);
      mt::parallel::World world(&argc, &argv);
      mt::stop_with_launcher();  // a rank whose mpirun died ends at once, not training on as an orphan
      return mt::parallel::run_main(world, [&](mt::parallel::World& w) {
        // Options and setup fail the same way on every rank (same arguments, same files): report
        // such an error once. A rank whose error was its own still reports it after a grace period.
        // Such an error is a refusal (exit status 2, runtime/exit_status.h: a relaunch cannot fix
        // it), but a failed communication (a peer that died) stays a recoverable 1, and a
        // CollectiveError keeps its own status.
        std::unique_ptr<mt::train::Trainer> t;
        try {
          const mt::config::TrainOptions o = mt::config::parse_train_options(args);
          mt::install_preemption_handlers(o.preempt_deadline);
          mt::train::check_memory_fits(o, w.comm(), w.local_rank(), w.local_size());  // before any allocation
          t = std::make_unique<mt::train::Trainer>(o, &w.comm(), w.local_rank());
        } catch (const mt::parallel::CollectiveError&) {
          throw;
        } catch (const mt::parallel::CommFailure&) {
          throw;
        } catch (const mt::Error& e) {
          throw mt::parallel::CollectiveError(e.what(), mt::kExitRefused);
        }
        try {
          return t->run();
        } catch (...) {
          // Under mpirun the failure is reported, and the job ended, before the trainer is torn down:
          // its destructor may wait (a checkpoint writer on a slow disk), and a rank that waited so
          // would let its peers time out into reporting the failure again. The job ends as a crash
          // would, which saves survive by design (run_main, parallel/launch.h).
          if (w.size() > 1) static_cast<void>(t.release());
          throw;
        }
      });
    }
    if (cmd == "bench") {
      mt::parallel::World world(&argc, &argv);
      return mt::parallel::run_main(world, [&](mt::parallel::World& w) { return mt::cli::bench_main(args, &w.comm(), w.local_rank()); });
    }
    if (cmd == "sample") return mt::cli::sample_main(args);
    if (cmd == "selftest") return mt::cli::selftest_main(args);
    if (cmd == "ckpt") return mt::cli::ckpt_main(argc - 2, argv + 2);
    if (cmd == "data") return mt::data::data_cli(argc - 2, argv + 2);
    if (cmd == "plan") return mt::plan::plan_main(args);
    if (cmd == "plot") return mt::cli::plot_main(args);
    mt::fail("unknown command '%s'\n%s", cmd.c_str(), kUsage);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minitrain: error: %s\n", e.what());
    return 1;
  }
}
