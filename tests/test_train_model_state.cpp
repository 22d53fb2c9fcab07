// Model state per parameter, measured by the arena over one training step (params, grads and
// optimizer peaks): fp32 holds 16 bytes per parameter (weights, gradients, two moments: the master is
// the compute copy); bf16 and fp16 hold the fp32 master, the 16-bit compute weights, fp32 gradients
// and two moments: 18 bytes. Under ZeRO-3 every part is a 1/dp shard, plus the gathered 16-bit weights
// of the units in use.
#include <gtest/gtest.h>

#include <algorithm>

#include "model/gpt.h"
#include "runtime/check.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

config::TrainOptions small(const std::string& precision) {
  return config::parse_train_options({"model=tiny", "model.vocab_size=64", "model.n_layer=4", "model.n_embd=64",
                              "model.n_head=4", "model.block_size=16", "seq_len=16", "batch_size=2", "steps=2",
                              "threads=1", "data.prefetch=0", "data.path=synthetic", "precision=" + precision});
}

TEST(ModelState, BytesPerParameterMeasuredByTheArena) {
  for (const char* zero : {"0", "3"}) {
    for (const char* precision : {"fp32", "bf16", "fp16"}) {
      config::TrainOptions o = small(precision);
      config::apply_option(o, "parallel.zero", zero);
      Trainer t(o);
      t.arena().reset_peaks();
      t.step();
      const MemStats& m = t.arena().stats();
      const double n = double(t.params().total_numel());
      size_t largest_unit = 0;
      for (const ParamUnit& u : t.params().units()) largest_unit = std::max(largest_unit, size_t(u.size()));
      const double params = double(m.peak[size_t(MemCategory::params)]);
      const double state = params + double(m.peak[size_t(MemCategory::grads)]) +
                           double(m.peak[size_t(MemCategory::optimizer)]);
      std::printf("zero %s %s: model state %.2f bytes per parameter (params %.2f)\n", zero, precision, state / n,
                  params / n);
      const double scalars = 64;  // the step's few scalars (norm, clip factor) in the optimizer's memory
      const double per_param = std::string(precision) == "fp32" ? 16 : 18;
      // ZeRO-3 adds the units in use: their gathered weights and gradient buffers, at most three units
      // at a time (one in use, the next prefetched, and the embeddings held through the classifier).
      const double in_use = std::string(zero) == "3" ? 3.0 * (per_param == 16 ? 8 : 6) * double(largest_unit) : 0;
      EXPECT_GE(state, per_param * n) << "zero " << zero << " " << precision;
      EXPECT_LE(state, per_param * n + in_use + scalars)
          << "zero " << zero << " " << precision << ": fp32 weights, gradients, two moments (16 bytes); "
          << "16-bit runs add the 16-bit weights (18)";
    }
  }
}

}  // namespace
}  // namespace mt::train
