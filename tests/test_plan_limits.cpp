// The planner's arithmetic at its bounds (config/limits.h): values past them are refused in one line
// naming the option, models at them give figures that are all finite, non-negative and consistent
// (no wrapped 64-bit product), and --search is bounded and reports its progress.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "runtime/check.h"

namespace mt::plan {
namespace {

void expect_refused(const std::vector<std::string>& args, const std::string& msg) {
  try {
    plan_report(args);
    ADD_FAILURE() << msg << ": accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

TEST(PlanLimits, ValuesBeyondTheArithmeticAreRefusedInOneLine) {
  const std::string beyond = " is beyond what minitrain's arithmetic holds: at most ";
  expect_refused({"model.n_embd=1000000000"}, "model.n_embd=1000000000" + beyond + "1048576 (2^20)");
  expect_refused({"model.vocab_size=2000000000"}, "model.vocab_size=2000000000" + beyond + "16777216 (2^24)");
  expect_refused({"model.n_layer=100000"}, "model.n_layer=100000" + beyond + "65536 (2^16)");
  expect_refused({"batch_size=2000000000"}, "batch_size=2000000000" + beyond);
  expect_refused({"tp=2097152"}, "parallel.tp=2097152" + beyond);
  expect_refused({"model=tiny-moe", "moe.experts=100000"}, "moe.experts=100000" + beyond);
  // Each option within its bound, their products not.
  expect_refused({"model.n_embd=1048576", "model.n_head=16", "model.n_layer=2000"},
                 "parameters, beyond what minitrain's arithmetic holds: at most 1125899906842624 (2^50");
  expect_refused({"model.block_size=16777216", "seq_len=16777216", "batch_size=64"}, "activation elements per step, beyond");
  expect_refused({"model.n_embd=262144", "model.n_head=4096", "model.n_layer=1300", "grad_accum=1024"},
                 "parameters x grad_accum 1024 = 1.1e+18 gradient elements per step, beyond");
  expect_refused({"zero=3", "dp=2", "model.n_layer=4096", "grad_accum=1024"},
                 "zero=3: grad_accum 1024 x 4098 parameter units = 4.2e+06 unit passes per step, more than the planner replays");
  expect_refused({"dp=1048576", "batch_size=1024", "model.block_size=1024", "seq_len=1024", "grad_accum=512",
                  "model.n_layer=1", "model.n_head=1", "model.n_embd=64"},
                 "batch_size 1024 x grad_accum 512 x dp 1048576 x seq_len 1024 = 5.63e+14 tokens per step, beyond");
  expect_refused({"dp=1024", "pp=2", "cp=2", "tp=512", "model.n_head=512", "model.n_embd=512"},
                 "dp 1024 x tp 512 x pp 2 x cp 2 = 2097152 ranks, beyond");
  // gpus= and the budget.
  expect_refused({"gpus=0"}, "gpus must be positive (got 0)");
  expect_refused({"gpus=-1"}, "gpus must be positive (got -1)");
  expect_refused({"gpus=1.5"}, "gpus must be an integer (got '1.5')");
  expect_refused({"gpus=1e9"}, "gpus must be an integer (got '1e9')");
  expect_refused({"gpus=1000000000"}, "gpus=1000000000" + beyond + "1048576 (2^20");
  expect_refused({"tokens=1e19"}, "tokens=1e+19 is beyond what the budget's arithmetic holds");
}

// Every figure of the JSON report finite and non-negative; the memory total the sum of its parts.
void expect_sane(const std::vector<std::string>& args) {
  SCOPED_TRACE(::testing::PrintToString(args));
  const nlohmann::json j = plan_json(parse_plan_request(args));
  EXPECT_GT(j["params"].get<double>(), 0);
  EXPECT_LE(j["active_params"].get<double>(), j["params"].get<double>());
  double sum = 0;
  for (auto& [k, v] : j["memory"].items()) {
    ASSERT_TRUE(v.is_number_unsigned()) << k << " " << v;
    EXPECT_LT(v.get<double>(), 0x1p62) << k;  // a wrapped uint64 shows as nearly 2^64
    if (k != "total") sum += v.get<double>();
  }
  EXPECT_EQ(sum, j["memory"]["total"].get<double>());
  for (auto& [k, v] : j["time"].items()) {
    EXPECT_TRUE(std::isfinite(v.get<double>()) && v.get<double>() >= 0) << k << " " << v;
  }
  EXPECT_GT(j["time"]["step_s"].get<double>(), 0);
  EXPECT_GT(j["flops_per_token"].get<double>(), 0);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["mfu"].get<double>(), 0);
  EXPECT_LE(j["mfu"].get<double>(), 1);
  for (auto& [group, ops] : j["comm"].items())
    for (auto& [op, c] : ops.items())
      if (c.is_object() && c.contains("sent_bytes")) {
        EXPECT_LT(c["sent_bytes"].get<double>(), 0x1p62) << group << " " << op;
      }
}

TEST(PlanLimits, ModelsAtTheBoundsGiveSaneFigures) {
  // Nearly 2^50 parameters (12 x 2^36 x 1300 = 1.07e15) over 2^15 GPUs, every parallel axis used.
  expect_sane({"model.n_embd=262144", "model.n_head=4096", "model.n_layer=1300", "hw=h100", "gpus=32768", "tp=8",
               "pp=4", "grad_accum=8", "zero=3", "precision=bf16", "tokens=1e15"});
  expect_sane({"model.n_embd=262144", "model.n_head=4096", "model.n_layer=1300", "hw=h100", "dp=8", "zero=0"});
  // 3/4 of 2^54 activation elements: a context of 2^24 tokens, attention probabilities materialized.
  expect_sane({"model.block_size=16777216", "seq_len=16777216", "batch_size=48", "model.n_layer=1", "model.n_head=1",
               "model.n_embd=64", "model.vocab_size=256"});
  // 2^48 tokens per step over 2^20 ranks.
  expect_sane({"gpus=1048576", "batch_size=16384", "model.block_size=32", "seq_len=32", "grad_accum=512",
               "model.n_layer=1", "model.n_head=1", "model.n_embd=32", "hw=h200", "zero=3", "tokens=1e18"});
  // Tensor parallelism over 4096 ranks at 2^54 activation elements (2^68 bytes if the tp formula multiplied
  // before it divided).
  expect_sane({"model.n_embd=262144", "model.n_head=4096", "model.n_layer=4", "model.vocab_size=524288", "tp=4096", "batch_size=8192",
               "grad_accum=16384", "hw=h100", "precision=bf16"});
  expect_sane({"model.n_embd=262144", "model.n_head=4096", "model.n_layer=4", "model.vocab_size=524288", "tp=4096", "tp.sp=false",
               "hw=h100", "recompute=full", "zero=3", "dp=16", "cp=16", "model.block_size=1024", "seq_len=1024", "batch_size=1", "grad_accum=16384"});
  // A mixture at the expert bound.
  expect_sane({"model=tiny-moe", "moe.experts=65536", "moe.top_k=2", "gpus=65536", "ep=65536", "hw=h100"});
}

// The tensor-parallel bytes of a step are linear in its micro-batches: at the bounds too, where the
// product of the formula's factors passes 2^64 unless it divides first.
TEST(PlanLimits, TensorParallelBytesScaleWithTheMicroBatchesAtTheBound) {
  auto tp_bytes = [](int accum) {
    const nlohmann::json j = plan_json(parse_plan_request(
        {"model.n_embd=262144", "model.n_head=4096", "model.n_layer=4", "model.vocab_size=524288", "tp=4096",
         "batch_size=8192", "grad_accum=" + std::to_string(accum), "hw=h100", "precision=bf16"}));
    return j["comm"]["tp"];
  };
  // Linear in the micro-batches plus the step's scalars: twice the micro-batches, twice the increase.
  const nlohmann::json quarter = tp_bytes(4096), half = tp_bytes(8192), full = tp_bytes(16384);
  for (const char* op : {"all_gather", "reduce_scatter"}) {
    const uint64_t q = quarter[op]["sent_bytes"], h = half[op]["sent_bytes"], f = full[op]["sent_bytes"];
    EXPECT_EQ(f - h, 2 * (h - q)) << op;
    EXPECT_GT(f, uint64_t(1) << 56) << op;
  }
}

TEST(PlanSearch, RefusesMoreLayoutsThanItsBound) {
  // 720720 = 2^4 3^2 5 7 11 13 chips: 89600 meshes, a million layouts.
  expect_refused({"--search", "gpus=720720"}, "plan --search gpus=720720: at least 1075200 layouts");
  expect_refused({"--search", "gpus=720720"}, "more than the search's bound of 100000: search fewer gpus");
}

TEST(PlanSearch, ReportsItsProgress) {
  const PlanRequest r = parse_plan_request({"--search", "gpus=4", "model=gpt2", "hw=h100", "batch_size=8", "seq_len=256"});
  std::vector<size_t> tried;
  size_t total = 0;
  SearchProgress every_layout{0, [&](size_t n, size_t of) { tried.push_back(n), total = of; }};
  const std::string out = plan_search(r, every_layout);
  // 4 chips: 15 meshes (tp, cp, pp, dp), two micro-batch sizes each where dp divides the batch, 4 x 3 modes.
  ASSERT_FALSE(tried.empty());
  EXPECT_EQ(tried.back(), total);
  for (size_t i = 0; i < tried.size(); i++) EXPECT_EQ(tried[i], i + 1);
  EXPECT_NE(out.find(": " + std::to_string(total) + " layouts, "), std::string::npos) << out;
}

}  // namespace
}  // namespace mt::plan
