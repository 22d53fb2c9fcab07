// `minitrain train --help` and `minitrain bench --help`: every option of the parser's table
// (config/options.cpp) with its type, default and meaning, grouped; and `minitrain --version`.
#pragma once
#include <string>
#include <vector>

namespace mt::cli {

// One line of the help: an option with its type (int, number, bool, string) and default, both read
// from config::TrainOptions{}.to_json(), so they are what the parser starts from.
struct HelpRow {
  std::string key, group, type, default_value, meaning;
};

// The groups in the order the help shows them.
const std::vector<std::string>& help_groups();
std::vector<HelpRow> help_rows();  // every option of the parser's table

// The whole text: usage line of `command` ("train" or "bench"), then the grouped table.
std::string train_help(const std::string& command);

// True when `args` asks for help (-h or --help anywhere).
bool wants_help(const std::vector<std::string>& args);

// `minitrain --version`: version, git revision at configure time, build configuration.
std::string version_text();

}  // namespace mt::cli
