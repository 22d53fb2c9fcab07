// `minitrain ckpt ...`: the checkpoint tools that need no model.
//   ls <dir>                 the checkpoints under a root: step, ranks, size, commit time, status
//                            (each verified: "ok, verified" or "DAMAGED: <why>")
//   verify <path>...         full verification of a checkpoint, of every checkpoint under a root, or
//                            of the one a root's `latest` file names
//   bench --dir D [--mb N] [--saves K] [--interval S]
//                            synchronous vs asynchronous save (copy at save(), and deferred
//                            snapshot) of N MB of fp32 state, S seconds of "training" apart:
//                            blocking and background times
// (`ckpt export`, which needs the model, lives with the trainer; it finds its checkpoint with
// resolve_checkpoint.)
#pragma once
#include <string>

namespace mt::checkpoint {

// The checkpoint that `path` names: a checkpoint directory as it is; a root's `latest` file, the
// checkpoint it names; a root, its newest checkpoint that verifies (find_latest_valid, one rank).
// Throws mt::Error naming the path when there is none.
std::string resolve_checkpoint(const std::string& path);

// argv[0] is the subcommand. Prints to stdout (errors to stderr); returns the exit code:
// 0 success, 1 a checkpoint failed verification or a tool error, 2 a usage error.
int ckpt_cli(int argc, char** argv);

}  // namespace mt::checkpoint
