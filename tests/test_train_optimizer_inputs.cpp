// What the trainer feeds AdamW (the kernel itself is pinned by tests/test_kernels_optimizer.cpp):
// the bias-correction count is the number of updates applied, not of steps taken (fp16 skips some);
// the gradient is unscaled and clipped against the unscaled norm; weight decay reaches the matrices
// only, never biases or LayerNorm parameters. Each is read back from the state the step left: the
// weights, the gradients (AdamW does not write them) and the moments (through a checkpoint).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "checkpoint/format.h"
#include "checkpoint/reader.h"
#include "data/shard.h"
#include "tests/test_train_util.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

class OptimizerInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("mt_optim_inputs");
    data_ = testing::write_counting_shard(dir_, 64, 200, testing::test_seed());
  }
  void TearDown() override { fs::remove_all(dir_); }

  config::TrainOptions options(const std::vector<std::string>& extra) const {
    std::vector<std::string> kv = {"model=tiny", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32",
                                   "model.n_head=4", "model.block_size=32", "batch_size=4", "seq_len=32",
                                   "steps=20", "optim.lr=1e-2", "optim.warmup_steps=0", "data.path=" + data_,
                                   "data.mode=shuffled", "out_dir=" + dir_ + "/run", "threads=2"};
    kv.insert(kv.end(), extra.begin(), extra.end());
    return config::parse_train_options(kv);
  }

  // The AdamW moments `part` ("adam_m/" or "adam_v/") of every parameter, in the store's layout.
  std::vector<float> moments(Trainer& t, const std::string& part) {
    const std::string root = dir_ + "/state";
    fs::remove_all(root);
    t.save_state(root);
    const checkpoint::Reader r(root + "/" + checkpoint::step_dir_name(t.step_count()));
    std::vector<float> out(size_t(t.params().total_numel()), 0.f);
    for (const ParamEntry& e : t.params().entries()) r.read(part + e.name, 0, e.numel, out.data() + e.offset);
    return out;
  }

  std::string dir_, data_;
};

// AdamW's first update moves each weight by lr * m1 / (sqrt(v1) + eps) with t = 1 in the bias
// corrections (plus decay). After fp16 overflows skipped the first steps, the first update applied
// must still be that one: a count that included the skipped steps (t = 2: the step shrinks by
// sqrt(1 - b2^2) / (1 - b1^2) = 0.74) would be wrong by a quarter of lr.
TEST_F(OptimizerInputs, AdamWCountsAppliedUpdatesNotSkippedSteps) {
  const config::TrainOptions o = options({"precision=fp16", "loss_scale.init=1e9", "optim.weight_decay=0.1"});
  Trainer t(o);
  const ParamStore& s = t.params();
  std::vector<float> w0;
  StepResult r;
  int skipped = 0;
  do {
    w0.assign(s.master(), s.master() + s.total_numel());
    r = t.step();
    skipped += r.skipped;
    ASSERT_LT(skipped, 40) << "the loss scale never fit";
  } while (r.skipped);
  ASSERT_GE(skipped, 1) << "no step was skipped: the case this test is about did not happen";
  const std::vector<float> m = moments(t, "adam_m/"), v = moments(t, "adam_v/");
  const double b1 = o.optim.beta1, b2 = o.optim.beta2, eps = o.optim.eps, lr = r.lr;
  double worst = 0;
  for (const ParamEntry& e : s.entries()) {
    const double wd = e.weight_decay ? o.optim.weight_decay : 0.0;
    for (int64_t k = e.offset; k < e.offset + e.numel; k++) {
      const double mhat = m[size_t(k)] / (1 - b1), vhat = v[size_t(k)] / (1 - b2);
      const double want = w0[size_t(k)] - lr * (mhat / (std::sqrt(vhat) + eps) + wd * w0[size_t(k)]);
      worst = std::max(worst, std::fabs(double(s.master()[k]) - want));
    }
  }
  std::printf("first update after %d skipped steps: max |w - w(t=1)| = %.3g (lr %.3g)\n", skipped, worst, lr);
  EXPECT_LT(worst, 1e-4 * lr) << "the first applied update did not use t = 1";
}

// The gradient AdamW sees is g / S * min(1, clip / |g / S|) for fp16's loss scale S (1 otherwise):
// its first moment m1 = (1 - b1) times that. Clipping against the loss-scaled norm |g| would shrink
// it S-fold when clipping is active, and clip an fp16 gradient whose true norm is below the limit.
TEST_F(OptimizerInputs, GradientIsUnscaledAndClippedAgainstTheUnscaledNorm) {
  for (const char* precision : {"fp32", "bf16", "fp16"})
    for (const char* clip : {"0.05", "100"}) {
      SCOPED_TRACE(std::string(precision) + " grad_clip=" + clip);
      std::vector<std::string> kv = {std::string("precision=") + precision, std::string("optim.grad_clip=") + clip};
      if (std::string(precision) == "fp16") kv.push_back("loss_scale.init=1024");  // fp32/bf16 refuse the key
      const config::TrainOptions o = options(kv);
      Trainer t(o);
      const StepResult r = t.step();
      ASSERT_FALSE(r.skipped);
      const ParamStore& s = t.params();
      const double scale = std::string(precision) == "fp16" ? 1024 : 1;
      double sum_sq = 0;
      for (int64_t k = 0; k < s.total_numel(); k++) sum_sq += double(s.grads()[k]) * s.grads()[k];
      const double norm = std::sqrt(sum_sq) / scale;
      EXPECT_NEAR(r.grad_norm, norm, 1e-5 * norm);
      const double coef = std::min(1.0, o.optim.grad_clip / norm) / scale;
      const std::vector<float> m = moments(t, "adam_m/");
      std::vector<float> want(m.size());
      for (size_t k = 0; k < m.size(); k++) want[k] = float((1 - o.optim.beta1) * coef * s.grads()[k]);
      const double err = testing::max_rel_error(m.data(), want.data(), m.size());
      std::printf("%s clip %s: |g| = %.4g, factor %.4g, m1 max rel err %.2e\n", precision, clip, norm, coef, err);
      EXPECT_LT(err, 1e-5);
    }
}

// One step with weight decay and one without, from the same state and data: the gradients and the
// moments are the same, so every 1-D parameter (biases, LayerNorm weights) ends bitwise the same,
// and every matrix differs.
TEST_F(OptimizerInputs, WeightDecayReachesMatricesButNotBiasesOrLayerNorms) {
  Trainer plain(options({"optim.weight_decay=0"})), decayed(options({"optim.weight_decay=0.5"}));
  plain.step();
  decayed.step();
  const ParamStore &a = plain.params(), &b = decayed.params();
  int vectors = 0, matrices = 0;
  for (const ParamEntry& e : a.entries()) {
    const bool same = std::memcmp(a.master() + e.offset, b.master() + e.offset, size_t(e.numel) * 4) == 0;
    if (e.global_shape.size() == 1) {
      vectors++;
      EXPECT_TRUE(same) << e.name << " (1-D) was decayed";
    } else {
      matrices++;
      EXPECT_FALSE(same) << e.name << " (a matrix) was not decayed";
    }
  }
  EXPECT_GT(vectors, 0);
  EXPECT_GT(matrices, 0);
}

}  // namespace
}  // namespace mt::train
