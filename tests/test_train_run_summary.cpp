// The start-of-run plan and the end-of-run summary, from fixed figures (no timing decides anything).
#include <gtest/gtest.h>

#include "train/run_summary.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(RunPlan, NamesLayoutBatchAndOutputs) {
  RunPlan p;
  p.model = "tiny";
  p.params = 1234567;
  p.flops_per_token = 7.5e6;
  p.tp = 2, p.cp = 1, p.pp = 3, p.dp = 4;
  p.batch_size = 5, p.grad_accum = 2, p.seq_len = 64;
  p.first_step = 10, p.steps = 30;
  p.precision = "bf16", p.recompute = "full", p.attention = "flash", p.device = "cpu";
  p.out_dir = "runs/x", p.ckpt_dir = "runs/x/checkpoints";
  const std::string s = format_run_plan(p);
  EXPECT_TRUE(has(s, "TP(2)-CP(1)-PP(3)-DP(4) on 24 ranks")) << s;
  p.ep = 2;  // expert parallelism, carved from dp: the world stays 24
  EXPECT_TRUE(has(format_run_plan(p), "TP(2)-CP(1)-PP(3)-DP(4) with EP(2) on 24 ranks")) << format_run_plan(p);
  p.ep = 1;
  EXPECT_TRUE(has(s, "40 rows x 64 tokens = 2.56k tokens per step")) << s;  // 5 x 2 x 4 rows
  EXPECT_TRUE(has(s, "steps      11 to 30: 51.20k tokens")) << s;         // 20 steps x 2560
  EXPECT_TRUE(has(s, "1.23M parameters")) << s;
  EXPECT_TRUE(has(s, "bf16, recompute full, attention flash")) << s;
  EXPECT_TRUE(has(s, "runs/x (checkpoints in runs/x/checkpoints)")) << s;
  p.data = "data/x";
  p.data_tokens = 102400;
  EXPECT_TRUE(has(format_run_plan(p), "data/x: 102.40k tokens; these steps read 0.50 epochs of it")) << format_run_plan(p);
  p.data_docs = 1500;
  EXPECT_TRUE(has(format_run_plan(p), "data/x: 102.40k tokens in 1.50k documents; these steps read 0.50 epochs"))
      << format_run_plan(p);
  EXPECT_FALSE(has(format_run_plan(p), "memory")) << "nothing allocated: no memory line";
  p.memory[int(MemCategory::params)] = 2 << 20;
  p.memory[int(MemCategory::optimizer)] = 4 << 20;
  EXPECT_TRUE(has(format_run_plan(p), "memory     params 2.0 MiB, optimizer 4.0 MiB on rank 0")) << format_run_plan(p);
  EXPECT_FALSE(has(format_run_plan(p), "expected")) << "no planner figures: no expected line";
  p.expected[int(MemCategory::params)] = 2 << 20;
  p.expected[int(MemCategory::activations)] = 6 << 20;
  EXPECT_TRUE(has(format_run_plan(p), "expected   peak per step on rank 0: params 2.0 MiB, activations 6.0 MiB; 8.0 MiB in all"))
      << format_run_plan(p);
}

// Two failed attempts: the first resumed at 0 and wrote steps 1-5, the second resumed from step 4's
// checkpoint (step 5 lost) and wrote 5-7 and a torn line, this one resumes from step 6 (step 7 lost).
TEST(RunTotals, CountsTheStepsEarlierAttemptsLost) {
  const std::string jsonl =
      "{\"event\":\"start\",\"resumed_at\":0}\n"
      "{\"step\":1,\"loss\":4.0,\"time\":{\"total\":1.0}}\n{\"step\":2,\"loss\":3.9,\"time\":{\"total\":1.0}}\n"
      "{\"step\":3,\"loss\":3.8,\"time\":{\"total\":1.0}}\n{\"step\":4,\"loss\":3.7,\"time\":{\"total\":1.0}}\n"
      "{\"step\":4,\"checkpoint\":{\"step\":4}}\n{\"step\":5,\"loss\":3.6,\"time\":{\"total\":1.5}}\n"
      "{\"event\":\"start\",\"resumed_at\":4}\n"
      "{\"step\":5,\"loss\":3.6,\"time\":{\"total\":2.0}}\n{\"step\":6,\"loss\":3.5,\"time\":{\"total\":2.0}}\n"
      "{\"step\":7,\"loss\":3.4,\"time\":{\"total\":2.25}}\n{\"step\":8,\"lo";
  const ResumeHistory h = resume_history(jsonl, 6);
  EXPECT_EQ(h.earlier_attempts, 2);
  EXPECT_EQ(h.redone_steps, 2);  // step 5 of the first attempt, step 7 of the second
  EXPECT_DOUBLE_EQ(h.redone_s, 1.5 + 2.25);
  RunTotals t;
  t.set_history(h);
  EXPECT_TRUE(has(t.format(1, {}), "restarts           2 earlier attempt(s); 2 step(s) lost and run again (3.8 s of step time)"))
      << t.format(1, {});
  EXPECT_TRUE(has(RunTotals().format(1, {}), "restarts           none (one attempt)"));
  // A run continued from its last step loses nothing.
  EXPECT_EQ(resume_history("{\"event\":\"start\",\"resumed_at\":0}\n{\"step\":1,\"loss\":4.0,\"time\":{\"total\":1.0}}\n", 1).redone_steps, 0);
}

StepResult step_with(double loss, long tokens, double t) {
  StepResult r;
  r.loss = loss;
  r.tokens = tokens;
  r.t_total = t;
  r.t_forward = t / 4;
  r.t_backward = t / 2;
  return r;
}

TEST(RunTotals, SumsStepsKeepsTheRunsPeakAndEachCheckpointOnce) {
  RunTotals tot;
  MemStats big, small;
  big.peak[int(MemCategory::activations)] = 3 << 20;
  small.peak[int(MemCategory::activations)] = 1 << 20;
  small.peak[int(MemCategory::params)] = 2 << 20;
  tot.add_step(1, step_with(5.0, 1000, 1.0), 0.10, 0.20, big);
  tot.add_step(2, step_with(4.0, 1000, 3.0), 0.30, 0.40, small);  // the last step's peak is not the run's
  tot.add_checkpoint(2);
  tot.add_checkpoint(2);
  tot.add_val_loss(4.5);
  EXPECT_EQ(tot.steps(), 2);
  EXPECT_EQ(tot.tokens(), 2000);
  EXPECT_EQ(tot.peak()[int(MemCategory::activations)], size_t(3) << 20);
  EXPECT_EQ(tot.peak()[int(MemCategory::params)], size_t(2) << 20);
  EXPECT_EQ(tot.checkpoints(), std::vector<int64_t>{2});
  const std::string s = tot.format(5.0, run_outputs("runs/x", "runs/x/checkpoints"));
  EXPECT_TRUE(has(s, "2 (1 to 2), 0 skipped")) << s;
  EXPECT_TRUE(has(s, "train loss         4.0000")) << s;
  EXPECT_TRUE(has(s, "val loss           4.5000")) << s;
  EXPECT_TRUE(has(s, "tokens/s           500")) << s;                   // 2000 tokens / 4 s of steps
  EXPECT_TRUE(has(s, "MFU / HFU          25.0% / 35.0%")) << s;         // weighted by step time
  EXPECT_TRUE(has(s, "forward 25%, backward 50%")) << s;
  EXPECT_TRUE(has(s, "activations 3.0 MiB")) << s;
  EXPECT_TRUE(has(s, "1, at step 2")) << s;
  EXPECT_TRUE(has(s, "runs/x/metrics.jsonl")) << s;
  EXPECT_TRUE(has(s, "runs/x/model.safetensors")) << s;
}

// A long CPU run reads its peak again at the end: a faster reading scales the steps' MFU and HFU
// down (they were against the start's); a slower one leaves them; both readings are named.
TEST(RunTotals, MfuTakesTheFasterOfTheStartAndEndPeaks) {
  auto totals = [] {
    RunTotals t;
    t.add_step(1, step_with(5.0, 1000, 1.0), 0.10, 0.20, MemStats{});
    t.add_step(2, step_with(4.0, 1000, 3.0), 0.30, 0.40, MemStats{});
    return t;
  };
  RunTotals faster = totals();
  faster.set_end_peak(100e9, 125e9);
  const std::string f = faster.format(5.0, {});
  EXPECT_TRUE(has(f, "MFU / HFU          20.0% / 28.0% (peak per rank read at the start, 100.00G, and at the end, "
                     "125.00G FLOP/s: the faster kept)")) << f;
  RunTotals slower = totals();
  slower.set_end_peak(100e9, 80e9);
  const std::string s = slower.format(5.0, {});
  EXPECT_TRUE(has(s, "MFU / HFU          25.0% / 35.0% (peak per rank read at the start, 100.00G, and at the end, "
                     "80.00G FLOP/s: the faster kept)")) << s;
  EXPECT_TRUE(has(totals().format(5.0, {}), "MFU / HFU          25.0% / 35.0%\n"));  // one reading: no note
}

TEST(RunTotals, HasACriticalBatchRowOnlyWithANoiseEstimate) {
  RunTotals t;
  EXPECT_FALSE(has(t.format(1, {}), "critical batch"));
  t.set_noise_scale(64e3, 8e3);
  EXPECT_TRUE(has(t.format(1, {}), "critical batch     B_noise ~ 64.00k tokens")) << t.format(1, {});
}

}  // namespace
}  // namespace mt::train
