// The layout rules: a tensor-parallel layout the model cannot be split for, a world that is not the
// product of the flags, sequence parallelism without tensor parallelism, rows that do not split over
// the sequence-parallel ranks: each fails with one line naming the flag and the numbers, before
// anything is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "runtime/check.h"
#include "tests/test_util.h"
#include "train/options.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

void expect_error(const std::function<void()>& f, const std::string& needle, const std::string& needle2 = "") {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    if (!needle2.empty()) {
      EXPECT_NE(what.find(needle2), std::string::npos) << what;
    }
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
  }
}

std::vector<std::string> tiny(std::vector<std::string> extra) {
  std::vector<std::string> a = {"model=tiny",         "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32",
                                "model.n_head=4",     "model.block_size=16", "seq_len=16",      "batch_size=2",
                                "data.prefetch=0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(LayoutRules, EachBadLayoutNamesItsFlagAndNumbers) {
  expect_error([] { parse_train_options(tiny({"--tp", "3"})); }, "--tp 3", "4 attention heads");
  // Heads divide, the padded vocabulary (128) does not.
  expect_error([] { parse_train_options(tiny({"--tp", "3", "model.n_head=3", "model.n_embd=24"})); }, "--tp 3",
               "padded vocabulary (128");
  expect_error([] { parse_train_options(tiny({"tp.sp=true"})); }, "tp.sp=true", "--tp 1");
  expect_error([] { parse_train_options(tiny({"--tp", "2", "batch_size=1", "seq_len=15"})); }, "tp.sp",
               "divisible by --tp 2");
  expect_error([] { parse_train_options(tiny({"--tp", "0"})); }, "parallel.tp");
  expect_error([] { parse_train_options(tiny({"--pp", "2"})); }, "--pp 2");
  expect_error([] { parse_train_options(tiny({"tp.sp=maybe"})); }, "tp.sp");
  // Rows that do not split are fine without sequence parallelism.
  EXPECT_NO_THROW(parse_train_options(tiny({"--tp", "2", "batch_size=1", "seq_len=15", "tp.sp=false"})));
  EXPECT_NO_THROW(parse_train_options(tiny({"--tp", "4"})));
}

TEST(LayoutRules, AWorldThatIsNotTheProductFailsBeforeWriting) {
  const std::string dir = testing::make_temp_dir("mt_layout");
  TrainOptions o = parse_train_options(tiny({"--tp", "2", "out_dir=" + dir + "/run", "data.path=" + dir + "/x.bin"}));
  expect_error([&] { Trainer t(o); }, "--tp 2", "world size 1");
  EXPECT_FALSE(std::filesystem::exists(dir + "/run"));
}

TEST(LayoutRules, TheResolvedConfigRecordsSequenceParallelism) {
  const TrainOptions a = parse_train_options(tiny({"--tp", "2"}));
  EXPECT_TRUE(a.sequence_parallel());
  const TrainOptions b = parse_train_options(tiny({"--tp", "2", "tp.sp=false"}));
  EXPECT_FALSE(b.sequence_parallel());
  EXPECT_EQ(b.to_json()["parallel"]["sp"], false);
  EXPECT_EQ(a.to_json()["parallel"]["sp"], "auto");
}

}  // namespace
}  // namespace mt::train
