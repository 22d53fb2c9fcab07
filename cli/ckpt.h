// `minitrain ckpt ls | verify | export | bench`.
#pragma once

namespace mt::cli {

// argv: the words after `ckpt`. Returns the process status (0 ok, 1 a failed check or an error, 2 usage).
int ckpt_main(int argc, char** argv);

}  // namespace mt::cli
