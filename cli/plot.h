// `minitrain plot RUN [RUN ...] [--out DIR]`: the plotting script (scripts/plot.py) on runs' metrics,
// found beside the binary wherever it was installed or built, so that an installed minitrain needs
// no source tree.
//
// Where the script is looked for, first hit wins (find_plot_script):
//   1. <directory of the running binary>/../share/minitrain/plot.py   the installed layout
//      (`cmake --install build --prefix P`: P/bin/minitrain beside P/share/minitrain/plot.py);
//   2. <the source tree this binary was configured from>/scripts/plot.py   a binary run from its build
//      directory.
// The running binary is /proc/self/exe, so a symbolic link to it (on PATH, say) finds the same files.
#pragma once
#include <string>
#include <vector>

namespace mt::cli {

// The installed layout, relative to the directory that holds the binary.
inline constexpr const char* kDataDirFromBin = "../share/minitrain";

// The installed data directory of a binary at `exe` (<its directory>/../share/minitrain, normalised).
std::string installed_data_dir(const std::string& exe);

// The plotting script for a binary at `exe` configured from `source_dir` (see above), or "" when
// neither place has it.
std::string find_plot_script(const std::string& exe, const std::string& source_dir);

// The `plot` command: runs the script with Python 3 (/usr/bin/python3, the one scripts/deps.sh gives
// matplotlib, else python3 on PATH), passing `args` on; its exit status is the script's. Throws one
// line when the script is nowhere to be found or Python cannot be started.
int plot_main(const std::vector<std::string>& args);

}  // namespace mt::cli
