// `minitrain train --help` is generated from the parser's table: every key the parser takes is listed
// (with a known group and a meaning), and every listed key parses with the default the help shows,
// giving back exactly the default options.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "cli/help.h"
#include "cli/version.h"
#include "config/options.h"

namespace mt::cli {
namespace {

struct Line {
  std::string key, type, default_value;
};

// The option lines of the help text: "  key  type  default  meaning".
std::vector<Line> help_lines(const std::string& text) {
  std::vector<Line> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("  ", 0) != 0) continue;
    std::istringstream w(line);
    Line l;
    w >> l.key >> l.type >> l.default_value;
    if (l.default_value == "''") l.default_value.clear();
    out.push_back(l);
  }
  return out;
}

TEST(OptionsHelp, EveryParsedKeyIsListedWithAGroupAndMeaning) {
  const std::vector<Line> lines = help_lines(train_help("train"));
  std::set<std::string> listed;
  for (const Line& l : lines) listed.insert(l.key);
  const auto& groups = help_groups();
  for (const config::OptionDoc& d : config::option_docs()) {
    EXPECT_TRUE(listed.count(d.key)) << d.key << " is parsed but not in the help";
    EXPECT_NE(std::find(groups.begin(), groups.end(), d.group), groups.end()) << d.key << ": group '" << d.group << "'";
    EXPECT_FALSE(d.meaning.empty()) << d.key << " has no meaning";
  }
  EXPECT_EQ(lines.size(), config::option_docs().size());
}

TEST(OptionsHelp, EveryListedKeyParsesWithItsShownDefault) {
  const nlohmann::json defaults = config::TrainOptions{}.to_json();
  for (const Line& l : help_lines(train_help("bench"))) {
    config::TrainOptions o;
    ASSERT_NO_THROW(config::apply_option(o, l.key, l.default_value)) << l.key << "=" << l.default_value;
    EXPECT_EQ(o.to_json(), defaults) << l.key << "=" << l.default_value << " is not the default";
    EXPECT_TRUE(l.type == "int" || l.type == "number" || l.type == "bool" || l.type == "string") << l.key;
  }
}

TEST(OptionsHelp, ShownDefaultIsTheParsersStart) {
  // A changed default shows up in the help: the row is read from config::TrainOptions{}, not written by hand.
  for (const HelpRow& r : help_rows()) {
    if (r.key == "steps") {
      EXPECT_EQ(r.default_value, std::to_string(config::TrainOptions{}.steps));
    }
    if (r.key == "precision") {
      EXPECT_EQ(r.default_value, "fp32");
    }
    if (r.key == "ckpt.async") {
      EXPECT_EQ(r.type, "bool");
    }
    if (r.key == "optim.lr") {
      EXPECT_EQ(r.type, "number");
    }
  }
}

TEST(OptionsHelp, WantsHelpAnywhereInTheArguments) {
  EXPECT_TRUE(wants_help({"steps=3", "--help"}));
  EXPECT_TRUE(wants_help({"-h"}));
  EXPECT_FALSE(wants_help({"steps=3", "out_dir=-h-dir"}));
}

TEST(Version, NamesRevisionAndBuild) {
  const std::string v = version_text();
  EXPECT_NE(v.find(kGitRevision), std::string::npos);
  EXPECT_NE(v.find(std::string("CUDA ") + (kCudaSimulated ? "simulated" : kHaveCuda ? "on" : "off")),
            std::string::npos);
  // A simulated device says so: its figures are not a GPU's.
  EXPECT_EQ(v.find("simulated device") != std::string::npos, kCudaSimulated);
  EXPECT_NE(v.find("MPI "), std::string::npos);
  EXPECT_NE(v.find("BLAS "), std::string::npos);
  EXPECT_FALSE(std::string(kGitRevision).empty());
}

TEST(OptionsHelp, ListsEveryMoeKeyInItsGroup) {
  int keys = 0;
  for (const HelpRow& r : help_rows())
    if (r.key.rfind("moe.", 0) == 0) keys += r.group == "moe";
  EXPECT_EQ(keys, 9);
}

}  // namespace
}  // namespace mt::cli
