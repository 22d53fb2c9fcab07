// Data parallelism on the GPU through NCCL, with the one GPU a test machine has: a one-rank dp group
// still runs every ZeRO stage's device code (shards copied out and gathered back, gradient buffers
// reduce-scattered per unit, parameters gathered per unit with prefetch) over an NCCL communicator on
// its own stream. With one rank every collective is an identity or a copy, so each stage must give
// the losses of the plain ZeRO-0 run up to summation order: stages 2-3 add each micro-batch's
// gradient to the shard in a separate kernel where ZeRO-0 accumulates inside the GEMM (beta = 1),
// and cuBLASLt may pick different algorithms for the two. fp32 and bf16 (where a last-bit difference
// in a master weight can flip its bf16 rounding). Skips without a device or NCCL.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

constexpr int kSteps = 6;

std::vector<double> run(const std::string& out, int zero, const std::string& precision) {
  config::TrainOptions o = config::parse_train_options(
      {"model=tiny", "model.vocab_size=64", "model.n_layer=3", "model.n_embd=32", "model.n_head=4",
       "model.block_size=32", "batch_size=4", "seq_len=32", "grad_accum=2", "steps=" + std::to_string(kSteps),
       "optim.lr=1e-2", "optim.warmup_steps=2", "precision=" + precision, "data.path=synthetic",
       "seed=" + std::to_string(testing::test_seed() % 100000), "out_dir=" + out, "device=cuda", "--zero", std::to_string(zero)});
  Trainer t(o);
  std::vector<double> v;
  for (int i = 0; i < kSteps; i++) v.push_back(t.step().loss);
  return v;
}

TEST(CudaZeroNccl, EveryStageOnOneRankGivesTheZeroZeroLosses) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
#ifndef MT_HAVE_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#endif
  const std::string dir = testing::make_temp_dir("cuda_zero");
  for (const char* precision : {"fp32", "bf16"}) {
    const double tol = std::string(precision) == "fp32" ? 1e-5 : 1e-2;  // relative
    const std::vector<double> want = run(dir + "/z0", 0, precision);
    for (int zero = 1; zero <= 3; zero++) {
      const std::vector<double> got = run(dir + "/z" + std::to_string(zero), zero, precision);
      for (int i = 0; i < kSteps; i++)
        EXPECT_NEAR(got[size_t(i)], want[size_t(i)], tol * want[size_t(i)])
            << precision << " ZeRO-" << zero << " step " << i;
    }
  }
}

}  // namespace
}  // namespace mt::train
