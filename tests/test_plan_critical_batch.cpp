// The critical batch (McCandlish et al. 2018): the step and token factors of doubling the batch at
// the limits and at B = B_noise, the note on each side, and the noise
// scale read back from a run's metrics.jsonl (the last estimate; a torn line skipped; none: an error
// naming the file).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "plan/critical_batch.h"
#include "runtime/check.h"
#include "tests/test_util.h"

namespace mt::plan {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(CriticalBatch, DoublingTheBatchHalvesTheStepsOnlyFarBelowTheNoiseScale) {
  EXPECT_NEAR((CriticalBatch{1e9, 1e3}.steps_factor_when_doubled()), 0.5, 1e-5);
  EXPECT_NEAR((CriticalBatch{1e9, 1e3}.tokens_factor_when_doubled()), 1.0, 1e-5);
  EXPECT_NEAR((CriticalBatch{1e3, 1e3}.steps_factor_when_doubled()), 0.75, 1e-12);  // (1 + 1/2) / 2
  EXPECT_NEAR((CriticalBatch{1e3, 1e3}.tokens_factor_when_doubled()), 1.5, 1e-12);   // (1 + 2) / 2
  EXPECT_NEAR((CriticalBatch{1e3, 1e9}.steps_factor_when_doubled()), 1.0, 1e-5);
  EXPECT_NEAR((CriticalBatch{1e3, 1e9}.tokens_factor_when_doubled()), 2.0, 1e-5);
  const std::string below = CriticalBatch{64e3, 8e3}.note(), above = CriticalBatch{8e3, 64e3}.note();
  EXPECT_TRUE(has(below, "B_noise ~ 64.00k tokens vs a global batch of 8.00k tokens")) << below;
  EXPECT_TRUE(has(below, "below the critical batch")) << below;
  EXPECT_TRUE(has(below, "0.56 x the steps")) << below;  // (1 + 4) / (1 + 8)
  EXPECT_TRUE(has(above, "above the critical batch")) << above;
  EXPECT_TRUE(has(above, "0.94 x the steps")) << above;  // (1 + 1/16) / (1 + 1/8)
}

TEST(CriticalBatch, ReadsTheLastLoggedNoiseScale) {
  const std::string dir = testing::make_temp_dir("mt_gns");
  {
    std::ofstream f(dir + "/metrics.jsonl");
    f << "{\"event\": \"start\"}\n{\"step\": 1, \"loss\": 4.0}\n{\"step\": 2, \"gns\": {\"b_simple\": 1200.5}}\n"
      << "{\"step\": 3, \"gns\": {\"b_simple\": 1500.25}}\n{\"step\": 4, \"gns\": {\"b_sim";  // torn
  }
  EXPECT_EQ(logged_noise_scale(dir), 1500.25);
  EXPECT_EQ(logged_noise_scale(dir + "/metrics.jsonl"), 1500.25);
  {
    std::ofstream f(dir + "/none.jsonl");
    f << "{\"step\": 1, \"loss\": 4.0}\n";
  }
  for (const std::string& bad : {dir + "/none.jsonl", dir + "/missing.jsonl"}) {
    try {
      logged_noise_scale(bad);
      ADD_FAILURE() << bad << ": accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(has(e.what(), bad)) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mt::plan
