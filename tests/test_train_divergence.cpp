// A run that diverges stops, says why, and leaves only finite checkpoints: a non-finite loss or
// gradient norm (fp32, bf16), fp16 skipping step after step, and non-finite weights at a save each
// end the run with DivergenceError (exit status 3), and every checkpoint left behind verifies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "checkpoint/catalog.h"
#include "checkpoint/reader.h"
#include "data/shard.h"
#include "runtime/check.h"
#include "tests/test_train_util.h"
#include "tests/test_util.h"
#include "train/divergence.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

class Divergence : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("mt_diverge");
    data_ = testing::write_random_shard(dir_, 64, 200, testing::test_seed());
  }
  void TearDown() override { fs::remove_all(dir_); }

  config::TrainOptions options(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"model=tiny", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32",
                                     "model.n_head=4", "model.block_size=32", "batch_size=4", "seq_len=32",
                                     "steps=40", "data.path=" + data_, "out_dir=" + dir_ + "/run", "threads=2",
                                     "log_every=100"};
    args.insert(args.end(), extra.begin(), extra.end());
    return config::parse_train_options(args);
  }

  // Runs to the end or to a DivergenceError, whose message is returned ("" if the run completed).
  static std::string run_until_stopped(const config::TrainOptions& o) {
    try {
      Trainer(o).run();
    } catch (const DivergenceError& e) {
      EXPECT_EQ(e.exit_status(), kExitDiverged);
      return e.what();
    }
    return "";
  }

  // Every checkpoint left verifies and holds finite weights and moments; returns how many there are.
  int expect_only_finite_checkpoints() const {
    const auto all = checkpoint::list_checkpoints(dir_ + "/run/checkpoints");
    for (const checkpoint::CatalogEntry& e : all) {
      EXPECT_NO_THROW(checkpoint::verify(e.path)) << e.path;
      const checkpoint::Reader r(e.path);
      for (const checkpoint::TensorInfo& t : r.tensors()) {
        std::vector<float> v(size_t(t.numel()));
        r.read(t.name, 0, t.numel(), v.data());
        EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); })) << e.path << ": " << t.name;
      }
    }
    return int(all.size());
  }

  std::string dir_, data_;
};

TEST_F(Divergence, NonFiniteLossStopsTheRunAndKeepsTheLastFiniteCheckpoint) {
  for (const char* prec : {"fp32", "bf16"}) {
    SCOPED_TRACE(prec);
    fs::remove_all(dir_ + "/run");
    // Far too high a learning rate and no clipping: the loss is NaN within a few steps.
    const config::TrainOptions o = options({std::string("precision=") + prec, "optim.lr=1e4", "optim.grad_clip=0",
                                    "optim.warmup_steps=0", "save_every=1", "ckpt.keep=2"});
    const std::string why = run_until_stopped(o);
    std::printf("%s: %s\n", prec, why.c_str());
    ASSERT_FALSE(why.empty()) << "a diverged run completed";
    EXPECT_NE(why.find("training diverged at step "), std::string::npos) << why;
    EXPECT_NE(why.find("non-finite"), std::string::npos) << why;
    EXPECT_FALSE(fs::exists(dir_ + "/run/model.safetensors")) << "a diverged run exported its weights";
    EXPECT_GE(expect_only_finite_checkpoints(), 1) << "retention deleted every finite checkpoint";
  }
}

TEST_F(Divergence, Fp16SkippingEveryStepStopsAfterMaxSkips) {
  // A loss scale of 1e30 overflows fp16 for ~90 halvings: far more than 5 skips in a row.
  const config::TrainOptions o = options({"precision=fp16", "loss_scale.init=1e30", "loss_scale.max_skips=5"});
  const std::string why = run_until_stopped(o);
  ASSERT_FALSE(why.empty()) << "fp16 skipped step after step and the run went on";
  EXPECT_NE(why.find("at step 5: fp16 skipped 5 steps in a row"), std::string::npos) << why;
  EXPECT_NE(why.find("loss_scale.max_skips=5"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(dir_ + "/run/model.safetensors"));
  EXPECT_THROW(options({"loss_scale.max_skips=0"}), Error);
}

TEST_F(Divergence, NonFiniteWeightsAreNeverSaved) {
  Trainer t(options({"steps=4"}));
  t.step();
  t.params().master()[7] = NAN;  // as a bad update would leave them
  try {
    t.save_state(dir_ + "/state");
    ADD_FAILURE() << "non-finite weights were saved";
  } catch (const DivergenceError& e) {
    EXPECT_NE(std::string(e.what()).find("after step 1 hold non-finite values"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(checkpoint::list_checkpoints(dir_ + "/state").empty());
}

}  // namespace
}  // namespace mt::train
