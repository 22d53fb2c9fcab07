// The trainer on the CUDA backend, against the CPU backend as reference: the same tiny model, data and
// seed give the same fp32 and bf16 losses within a tolerance, two GPU runs agree bitwise, and a training state
// saved on the GPU resumes there to the same losses. Every test skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "data/shard.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

constexpr int kVocab = 64;
constexpr int kSteps = 10;
// fp32 on both backends; the GPU's reduction orders and FMA contraction differ from the CPU's, and ten
// AdamW steps amplify that only slightly at this size. On the simulated device the products are the
// CPU's own GEMM and the kernels run in fp32 without contraction, so the losses keep the project's fp32
// bound for a new path. The weights' bound stays wider on both: at lr 1e-2, AdamW moves a weight whose
// gradient is near zero by about lr whatever the gradient's size, so a last-bit difference in such a
// gradient shows as ~1e-4 of the largest weight after ten steps.
#ifdef MT_CUDA_SIM
constexpr double kLossRelTol = 1e-5;
#else
constexpr double kLossRelTol = 1e-4;
#endif
constexpr double kWeightTol = 1e-3;

// Documents of random tokens, drawn from the test seed.
std::string write_random_shard(const std::string& dir, uint64_t seed) {
  data::ShardBuilder b(uint32_t(kVocab), uint32_t(kVocab - 1));
  std::mt19937_64 rng(seed);
  for (int d = 0; d < 200; d++) {
    std::vector<int32_t> doc(size_t(8 + rng() % 40));
    for (auto& t : doc) t = int32_t(rng() % uint64_t(kVocab - 1));
    b.add_document(doc);
  }
  const std::string path = dir + "/random.bin";
  b.write(path);
  return path;
}

config::TrainOptions tiny_options(const std::string& data, const std::string& out, const std::string& device,
                          uint64_t seed, const std::string& precision = "fp32") {
  config::TrainOptions o = config::parse_train_options({"model=tiny", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32",
                              "model.n_head=4", "model.block_size=32", "batch_size=4", "seq_len=32",
                              "grad_accum=2", "steps=" + std::to_string(kSteps), "optim.lr=1e-2",
                              "optim.warmup_steps=2", "precision=fp32", "data.path=" + data, "data.mode=shuffled",
                              "seed=" + std::to_string(seed % 100000), "out_dir=" + out, "threads=2",
                              "device=" + device});
  config::apply_option(o, "precision", precision);
  return o;
}

std::vector<double> losses(Trainer& t, int steps) {
  std::vector<double> v;
  for (int i = 0; i < steps; i++) v.push_back(t.step().loss);
  return v;
}

class CudaTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    seed_ = testing::test_seed();
    dir_ = testing::make_temp_dir("mt_cuda_train");
    data_ = write_random_shard(dir_, seed_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  config::TrainOptions options(const std::string& device, const std::string& run, const std::string& precision = "fp32") {
    return tiny_options(data_, dir_ + "/" + run, device, seed_, precision);
  }
  uint64_t seed_ = 0;
  std::string dir_, data_;
};

TEST_F(CudaTrain, FirstStepsMatchTheCpuBackendInFp32) {
  Trainer cpu(options("cpu", "cpu"));
  Trainer gpu(options("cuda", "gpu"));
  const std::vector<double> a = losses(cpu, kSteps), b = losses(gpu, kSteps);
  for (int i = 0; i < kSteps; i++) {
    ASSERT_TRUE(std::isfinite(b[size_t(i)])) << "step " << i + 1;
    EXPECT_LE(std::abs(b[size_t(i)] - a[size_t(i)]) / std::abs(a[size_t(i)]), kLossRelTol)
        << "step " << i + 1 << ": cuda " << b[size_t(i)] << " vs cpu " << a[size_t(i)];
  }
  // The weights moved the same way too (not only the losses).
  const std::vector<float> wa = cpu.full_master(), wb = gpu.full_master();
  ASSERT_EQ(wa.size(), wb.size());
  EXPECT_LE(testing::max_rel_error(wb.data(), wa.data(), wa.size()), kWeightTol);
}

// Every precision, activation-recompute mode and attention path of one rank against the CPU backend
// with the same settings, a few steps each: fp32 within kLossRelTol (losses and weights), bf16 and fp16
// within a few units of their precision (fp16 with its dynamic loss scale, on the device).
TEST_F(CudaTrain, EveryPrecisionRecomputeAndAttentionFollowsTheCpuBackend) {
  struct Case {
    const char* precision;
    const char* recompute;
    const char* attention;
    double tol;
  };
  const Case cases[] = {
      {"fp32", "none", "materialized", kLossRelTol}, {"fp32", "selective", "flash", kLossRelTol},
      {"fp32", "full", "flash", kLossRelTol},        {"fp32", "full", "materialized", kLossRelTol},
      {"bf16", "selective", "flash", 2e-2},          {"fp16", "none", "flash", 5e-3},
      {"fp16", "full", "materialized", 5e-3},
  };
  constexpr int kFew = 4;
  for (const Case& c : cases) {
    const std::string name = std::string(c.precision) + " recompute=" + c.recompute + " attention=" + c.attention;
    std::vector<double> got, want;
    std::vector<float> wgot, wwant;
    for (const char* device : {"cpu", "cuda"}) {
      config::TrainOptions o = options(device, std::string(device) + "_" + c.precision + c.recompute + c.attention,
                                       c.precision);
      config::apply_option(o, "recompute", c.recompute);
      config::apply_option(o, "attention", c.attention);
      o.steps = kFew;
      Trainer t(o);
      (std::string(device) == "cpu" ? want : got) = losses(t, kFew);
      (std::string(device) == "cpu" ? wwant : wgot) = t.full_master();
    }
    for (int i = 0; i < kFew; i++) {
      ASSERT_TRUE(std::isfinite(got[size_t(i)])) << name << " step " << i + 1;
      EXPECT_LE(std::abs(got[size_t(i)] - want[size_t(i)]) / std::abs(want[size_t(i)]), c.tol)
          << name << " step " << i + 1 << ": cuda " << got[size_t(i)] << " vs cpu " << want[size_t(i)];
    }
    if (std::string(c.precision) == "fp32") {
      EXPECT_LE(testing::max_rel_error(wgot.data(), wwant.data(), wwant.size()), kWeightTol) << name;
    }
  }
}

// bf16 storage on both backends (the CPU stores the same 16-bit values): the backends' fp32 sums
// differ in order, and a last-bit difference flips a bf16 rounding now and then, so the bound is a few
// bf16 units rather than fp32's. Both attention paths on the GPU against the CPU's materialised one.
TEST_F(CudaTrain, FirstStepsMatchTheCpuBackendInBf16) {
  constexpr double kBf16LossRelTol = 2e-2;
  Trainer cpu(options("cpu", "cpu", "bf16"));
  const std::vector<double> a = losses(cpu, kSteps);
  for (const char* attention : {"flash", "materialized"}) {
    config::TrainOptions o = options("cuda", std::string("gpu_") + attention, "bf16");
    config::apply_option(o, "attention", attention);
    Trainer gpu(o);
    const std::vector<double> b = losses(gpu, kSteps);
    for (int i = 0; i < kSteps; i++) {
      ASSERT_TRUE(std::isfinite(b[size_t(i)])) << attention << " step " << i + 1;
      EXPECT_LE(std::abs(b[size_t(i)] - a[size_t(i)]) / std::abs(a[size_t(i)]), kBf16LossRelTol)
          << attention << " step " << i + 1 << ": cuda " << b[size_t(i)] << " vs cpu " << a[size_t(i)];
    }
  }
}

TEST_F(CudaTrain, TwoGpuRunsGiveIdenticalLossesInBf16) {
  Trainer first(options("cuda", "a", "bf16"));
  const std::vector<double> a = losses(first, kSteps);
  Trainer second(options("cuda", "b", "bf16"));
  const std::vector<double> b = losses(second, kSteps);
  for (int i = 0; i < kSteps; i++) EXPECT_EQ(a[size_t(i)], b[size_t(i)]) << "step " << i + 1;
}

TEST_F(CudaTrain, TwoGpuRunsGiveIdenticalLosses) {
  Trainer first(options("cuda", "a"));
  const std::vector<double> a = losses(first, kSteps);
  Trainer second(options("cuda", "b"));
  const std::vector<double> b = losses(second, kSteps);
  for (int i = 0; i < kSteps; i++) EXPECT_EQ(a[size_t(i)], b[size_t(i)]) << "step " << i + 1;
}

TEST_F(CudaTrain, StateSavedOnTheGpuResumesToTheSameLosses) {
  const int half = kSteps / 2;
  Trainer whole(options("cuda", "whole"));
  const std::vector<double> want = losses(whole, kSteps);
  const std::string root = dir_ + "/state";
  {
    Trainer first(options("cuda", "first"));
    losses(first, half);
    first.save_state(root);
  }
  config::TrainOptions o = options("cuda", "second");
  o.resume = root;
  Trainer second(o);
  ASSERT_EQ(second.step_count(), half);
  const std::vector<double> got = losses(second, kSteps - half);
  for (int i = 0; i < kSteps - half; i++) EXPECT_EQ(got[size_t(i)], want[size_t(half + i)]) << "step " << half + i + 1;
}

}  // namespace
}  // namespace mt::train
