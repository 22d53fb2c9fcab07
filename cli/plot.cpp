#include "cli/plot.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cli/help.h"
#include "cli/version.h"
#include "runtime/check.h"

namespace mt::cli {

namespace fs = std::filesystem;

std::string installed_data_dir(const std::string& exe) {
  return (fs::path(exe).parent_path() / kDataDirFromBin).lexically_normal().string();
}

std::string find_plot_script(const std::string& exe, const std::string& source_dir) {
  std::error_code ec;
  const fs::path installed = fs::path(installed_data_dir(exe)) / "plot.py";
  if (fs::is_regular_file(installed, ec)) return installed.string();
  const fs::path in_tree = fs::path(source_dir) / "scripts" / "plot.py";
  if (!source_dir.empty() && fs::is_regular_file(in_tree, ec)) return in_tree.string();
  return "";
}

int plot_main(const std::vector<std::string>& args) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) fail("plot: cannot read /proc/self/exe to find the plotting script: %s", ec.message().c_str());
  const std::string installed = installed_data_dir(exe.string());
  const std::string script = find_plot_script(exe.string(), kSourceDir);
  if (args.empty() || wants_help(args)) {
    std::fprintf(args.empty() ? stderr : stdout,
                 "usage: minitrain plot RUN [RUN ...] [--out DIR]\n"
                 "  plots each run's metrics.jsonl (RUN: a run directory or a metrics.jsonl file) with\n"
                 "  scripts/plot.py: loss and validation loss, tokens/s and MFU, memory by category, the\n"
                 "  gradient noise scale, and MoE load and the pipeline bubble when logged; several runs\n"
                 "  are drawn side by side. PNGs go to --out (default: the first run's directory).\n"
                 "  The script is looked for in %s (an installed minitrain), then in\n"
                 "  %s/scripts (the source tree it was built from).\n"
                 "  script: %s\n",
                 installed.c_str(), kSourceDir, script.empty() ? "(not found)" : script.c_str());
    return args.empty() ? 2 : 0;
  }
  if (script.empty())
    fail("plot: plot.py is neither in %s nor in %s/scripts (install with cmake --install, or run the binary "
         "of a build of this source tree)",
         installed.c_str(), kSourceDir);
  const char* python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  std::vector<char*> argv{const_cast<char*>(python), const_cast<char*>(script.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  execvp(python, argv.data());
  fail("plot: cannot run %s: %s", python, std::strerror(errno));
}

}  // namespace mt::cli
