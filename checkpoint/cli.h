// `minitrain ckpt ...`: the checkpoint tools that need no model.
//   ls <dir>                 the checkpoints under a root: step, ranks, size, commit time, status
//                            (manifest, files and headers checked; checksums are verify's job)
//   verify <path>...         full verification of a checkpoint, or of every checkpoint under a root
//   bench --dir D [--mb N] [--saves K] [--interval S]
//                            synchronous vs asynchronous save (copy at save(), and deferred
//                            snapshot) of N MB of fp32 state, S seconds of "training" apart:
//                            blocking and background times
// (`ckpt export`, which needs the model, lives with the trainer.)
#pragma once

namespace mt::checkpoint {

// argv[0] is the subcommand. Prints to stdout (errors to stderr); returns the exit code:
// 0 success, 1 a checkpoint failed verification or a tool error, 2 a usage error.
int ckpt_cli(int argc, char** argv);

}  // namespace mt::checkpoint
