// The options' own bounds (config/limits.h) and the options refused when the resolved options would
// ignore them (config/ignored_options.h), as `minitrain train` and `minitrain plan` both parse them.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "config/limits.h"
#include "config/options.h"
#include "runtime/check.h"

namespace mt::config {
namespace {

std::string refusal(const std::vector<std::string>& args) {
  try {
    parse_train_options(args);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  return "accepted";
}

void expect_refused(const std::vector<std::string>& args, const std::string& msg) {
  const std::string why = refusal(args);
  EXPECT_NE(why.find(msg), std::string::npos) << ::testing::PrintToString(args) << ": " << why;
}

TEST(OptionLimits, EachBoundedOptionIsAcceptedAtItsBoundAndRefusedPastIt) {
  // Alone, each at its bound is a valid run's option (with what it needs beside it); one more is not.
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"model.n_embd", {"model.n_head=1", "model.n_layer=1", "model.vocab_size=8", "model.block_size=8", "seq_len=8"}},
      {"model.n_layer", {}},
      {"model.n_head", {"model.n_embd=65536", "model.n_layer=1"}},
      {"model.vocab_size", {}},
      {"model.block_size", {"model.n_embd=8", "model.n_head=1"}},
      {"batch_size", {}},
      {"grad_accum", {}},
      {"parallel.dp", {}},
      {"moe.experts", {"model=tiny-moe"}},
      {"data.prefetch", {}},
      {"threads", {}},
  };
  for (const auto& [key, with] : cases) {
    const double bound = option_limit(key);
    ASSERT_GT(bound, 0) << key;
    std::vector<std::string> at = with, past = with;
    at.push_back(key + "=" + std::to_string(int64_t(bound)));
    past.push_back(key + "=" + std::to_string(int64_t(bound) + 1));
    EXPECT_EQ(refusal(at), "accepted") << key;
    expect_refused(past, key + "=" + std::to_string(int64_t(bound) + 1) +
                             " is beyond what minitrain's arithmetic holds: at most " + std::to_string(int64_t(bound)));
  }
}

TEST(OptionLimits, ProductsOfOptionsAreBoundedByTheTrainerToo) {
  expect_refused({"model.n_embd=1048576", "model.n_head=16", "model.n_layer=2000"}, "parameters, beyond");
  expect_refused({"dp=1048576", "tp=2", "model.n_head=2"}, "= 2097152 ranks, beyond");
  expect_refused({"global_batch=2000000000", "model.block_size=1048576", "seq_len=1048576", "model.n_layer=1",
                  "model.n_embd=8", "model.n_head=1"}, "global_batch 2000000000 x seq_len 1048576 = 2.1e+15 tokens per step, beyond");
}

TEST(IgnoredOptions, MixtureOptionsOfADenseModelAreRefusedEachNamed) {
  for (const std::string kv : {"moe.top_k=1", "moe.capacity=1.25", "moe.every=2", "moe.balance=bias",
                               "moe.aux_coef=0.1", "moe.z_coef=0", "moe.bias_rate=0.01"}) {
    expect_refused({kv}, kv + " needs a mixture of experts (moe.experts > 0");
    expect_refused({"model=tiny-moe", "moe.experts=0", kv}, kv + " needs a mixture of experts");
    EXPECT_EQ(refusal({"model=tiny-moe", kv}), "accepted") << kv;
  }
  expect_refused({"--moe.top_k", "1"}, "moe.top_k=1 needs a mixture of experts");
  expect_refused({"moe.shared=1"}, "moe.shared=1 needs a mixture of experts");
  EXPECT_EQ(refusal({"moe.experts=0"}), "accepted");
}

TEST(IgnoredOptions, TraceStepsWithoutATraceAreRefused) {
  expect_refused({"trace.steps=2"}, "trace.steps=2 needs trace=1");
  expect_refused({"trace.start=3", "trace=0"}, "trace.start=3 needs trace=1");
  EXPECT_EQ(refusal({"trace=1", "trace.start=3", "trace.steps=2"}), "accepted");
}

TEST(IgnoredOptions, LossScaleOptionsOutsideFp16AreRefused) {
  for (const std::string kv : {"loss_scale.init=1024", "loss_scale.growth_interval=100"}) {
    expect_refused({kv}, kv + " needs precision=fp16");
    expect_refused({"precision=bf16", kv}, kv + " needs precision=fp16");
    EXPECT_EQ(refusal({"precision=fp16", kv}), "accepted") << kv;
    EXPECT_EQ(refusal({kv, "precision=fp16"}), "accepted") << kv;  // in any order
  }
  EXPECT_EQ(refusal({"precision=bf16", "loss_scale.max_skips=3"}), "accepted");  // the divergence guard's
}

TEST(IgnoredOptions, AConfigFileMayHoldEveryKey) {
  // A run's resolved config.json holds every key, the dense model's moe.* and trace.* included.
  const std::string path = ::testing::TempDir() + "/ignored_options_config.json";
  std::ofstream(path) << TrainOptions{}.to_json().dump();
  EXPECT_EQ(refusal({"--config", path}), "accepted");
  std::remove(path.c_str());
}

TEST(OptionDocs, KeepZeroKeepsEveryCheckpoint) {
  for (const OptionDoc& d : option_docs())
    if (d.key == "ckpt.keep") {
      EXPECT_NE(d.meaning.find("0: keep all"), std::string::npos) << d.meaning;
    }
}

}  // namespace
}  // namespace mt::config
