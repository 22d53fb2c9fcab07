// The metrics log a reader can trust: a failed write is an error, and no reader ever sees a torn
// record. (The FLOP accounting behind MFU and HFU: tests/test_model_flops.cpp.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "runtime/check.h"
#include "tests/test_util.h"
#include "train/metrics.h"

namespace mt::train {
namespace {

std::string file_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A full disk fails the write, naming the file and the reason (not a silently missing record).
TEST(MetricsLog, FailedWriteIsAnErrorNamingTheFile) {
  JsonlWriter w("/dev/full", false);
  try {
    w.write({{"step", 1}});
    ADD_FAILURE() << "a write to a full device was ignored";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("writing /dev/full: No space left on device (errno 28)"), std::string::npos)
        << e.what();
  }
}

// A record that only partly fits (the file size limit reached mid-line) is cut off again: the file
// holds exactly the whole records before it.
TEST(MetricsLog, PartlyWrittenRecordIsCutOff) {
  const std::string dir = testing::make_temp_dir("metrics_cut");
  const std::string path = dir + "/metrics.jsonl";
  JsonlWriter w(path, false);
  w.write({{"step", 1}, {"loss", 2.5}});
  const std::string before = file_text(path);
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of killing the process
  rlimit small = old;
  small.rlim_cur = before.size() + 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string error;
  try {
    w.write({{"step", 2}, {"loss", 2.25}, {"note", std::string(100, 'x')}});
  } catch (const Error& e) {
    error = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, SIG_DFL);
  EXPECT_NE(error.find("writing " + path + ": File too large"), std::string::npos) << error;
  EXPECT_EQ(file_text(path), before) << "a torn record stayed in the file";
  std::filesystem::remove_all(dir);
}

// Appending (a resumed run) cuts a torn last line left by a killed run, and says how much it cut.
TEST(MetricsLog, AppendCutsATornLastLine) {
  const std::string dir = testing::make_temp_dir("metrics_torn");
  const std::string path = dir + "/metrics.jsonl";
  const std::string whole = "{\"step\":1}\n{\"step\":2}\n";
  for (const std::string& torn : {std::string("{\"step\":3,\"lo"), std::string()}) {
    std::ofstream(path, std::ios::binary) << whole << torn;
    JsonlWriter w(path, true);
    EXPECT_EQ(w.cut_bytes(), torn.size());
    w.write({{"step", 3}});
    EXPECT_EQ(file_text(path), whole + "{\"step\":3}\n");
  }
  std::ofstream(path, std::ios::binary) << "{\"st";  // nothing whole at all
  EXPECT_EQ(JsonlWriter(path, true).cut_bytes(), 4u);
  EXPECT_EQ(file_text(path), "");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mt::train
