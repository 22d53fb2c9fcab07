// Model state per parameter, measured by the arena over one training step (params, grads and
// optimizer peaks): fp32 holds 16 bytes per parameter (weights, gradients, two moments: the master is
// the compute copy); bf16 and fp16 hold the fp32 master, an fp32 copy rounded to the compute type,
// fp32 gradients and two moments (20 bytes) plus the 16-bit weights of the units in use, never a
// full-size 16-bit copy.
#include <gtest/gtest.h>

#include <algorithm>

#include "model/gpt.h"
#include "runtime/check.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

TrainOptions small(const std::string& precision) {
  return parse_train_options({"model=tiny", "model.vocab_size=64", "model.n_layer=4", "model.n_embd=64",
                              "model.n_head=4", "model.block_size=16", "seq_len=16", "batch_size=2", "steps=2",
                              "threads=1", "data.prefetch=0", "data.path=synthetic", "precision=" + precision});
}

TEST(ModelState, BytesPerParameterMeasuredByTheArena) {
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    Trainer t(small(precision));
    t.arena().reset_peaks();
    t.step();
    const MemStats& m = t.arena().stats();
    const double n = double(t.params().total_numel());
    size_t largest_unit = 0;
    for (const ParamUnit& u : t.params().units()) largest_unit = std::max(largest_unit, size_t(u.size()));
    const double params = double(m.peak[size_t(MemCategory::params)]);
    const double state = params + double(m.peak[size_t(MemCategory::grads)]) +
                         double(m.peak[size_t(MemCategory::optimizer)]);
    std::printf("%s: model state %.2f bytes per parameter (params %.2f)\n", precision, state / n, params / n);
    const double scalars = 64;  // the step's few scalars (norm, clip factor) in the optimizer's memory
    if (std::string(precision) == "fp32") {
      EXPECT_GE(state, 16 * n);
      EXPECT_LE(state, 16 * n + scalars) << "weights, gradients, two moments: 16 bytes";
    } else {
      // The 16-bit weights of at most two units at a time (the final norm is held through the
      // classifier, which uses the embeddings).
      EXPECT_GE(state, 20 * n);
      EXPECT_LE(state, 20 * n + 2.0 * 2 * double(largest_unit) + scalars) << "a full-size 16-bit copy is kept";
    }
  }
}

}  // namespace
}  // namespace mt::train
