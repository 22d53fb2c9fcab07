// `minitrain ckpt`: ls, verify and bench come from the checkpoint library (checkpoint/cli.cpp); export
// needs the model's names, so it lives here, above the trainer.
#include "cli/ckpt.h"

#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/cli.h"
#include "cli/help.h"
#include "runtime/check.h"
#include "train/trainer.h"

namespace mt::cli {

// `ckpt export <checkpoint> <out.safetensors> [--all]`: the master weights of a checkpoint, whatever
// layout wrote it, as one HF-named safetensors file (with --all also the AdamW moments, under their
// checkpoint names). ls and verify come from the checkpoint library.
int ckpt_main(int argc, char** argv) {
  if (argc >= 1 && std::string(argv[0]) == "export" && !wants_help(std::vector<std::string>(argv + 1, argv + argc))) {
    if (argc < 3 || argc > 4 || (argc == 4 && std::string(argv[3]) != "--all"))
      fail("usage: minitrain ckpt export <checkpoint, root or root/latest> <out.safetensors> [--all]");
    train::export_checkpoint(checkpoint::resolve_checkpoint(argv[1]), argv[2], argc == 4);
    return 0;
  }
  return checkpoint::ckpt_cli(argc, argv);
}

}  // namespace mt::cli
