// The classifier's row chunks (model::classifier_rows), which the trainer runs and the planner sizes
// the logits buffer with: as many rows as the logits budget holds (256 MiB on the CPU, 1 GiB on a
// GPU), split evenly, never under 256 rows and never more than N.
#include <gtest/gtest.h>

#include "model/gpt.h"

namespace mt::model {
namespace {

TEST(ClassifierRows, ChunksAreAsLargeAsTheLogitsBudgetAllowsSplitEvenly) {
  const int Vp = 50304;  // GPT-2's padded vocabulary: 1334 fp32 rows fit in 256 MiB, 10672 bf16 in 1 GiB
  EXPECT_EQ(classifier_rows(Device::cpu, 1024, Vp, 4), 1024);  // B=4 T=256: one chunk
  EXPECT_EQ(classifier_rows(Device::cpu, 1334, Vp, 4), 1334);
  EXPECT_EQ(classifier_rows(Device::cpu, 1335, Vp, 4), 668);   // two even chunks, not 1334 + 1
  EXPECT_EQ(classifier_rows(Device::cpu, 8192, Vp, 4), 1171);  // B=8 T=1024: 7 chunks
  EXPECT_EQ(classifier_rows(Device::cpu, 8192, Vp, 2), 2048);  // bf16: 2668 rows fit, so 4 chunks
  EXPECT_EQ(classifier_rows(Device::cuda, 32768, Vp, 2), 8192);
  EXPECT_EQ(classifier_rows(Device::cpu, 7, Vp, 4), 7);  // never more than N
  EXPECT_EQ(classifier_rows(Device::cpu, 0, Vp, 4), 0);
  // A vocabulary too wide for 256 rows in the budget still takes 256: the floor.
  EXPECT_EQ(classifier_rows(Device::cpu, 4096, 1 << 20, 4), 256);
  // Tensor parallelism holds Vl = Vp / tp columns: four times the rows fit (5336), so one chunk.
  EXPECT_EQ(classifier_rows(Device::cpu, 4096, Vp / 4, 4), 4096);
}

}  // namespace
}  // namespace mt::model
