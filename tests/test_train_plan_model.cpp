// `minitrain plan`'s figures: the memory model against a single-rank Trainer's arena (model state
// exactly, activations within 5%) for each precision and recompute mode, the hardware entries and
// files (and one line naming the file and field for each malformed one), the report's figures
// against each other (FLOPs, MFU, budget), the JSON form's memory names, the fit check and the search.
// tests/mpi/mpi_plan_test.cpp does the same against several ranks' counters.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "runtime/check.h"
#include "runtime/exit_status.h"
#include "tests/test_util.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

using mt::testing::make_temp_dir;

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in:\n" << text;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

TEST(PlanMemory, ModelStateIsExactAndActivationsWithinFivePercentOnOneRank) {
  struct Case {
    const char* precision;
    const char* recompute;
    int accum;
  };
  for (const Case& c : {Case{"fp32", "none", 1}, Case{"bf16", "none", 2}, Case{"fp32", "selective", 1},
                        Case{"bf16", "full", 1}, Case{"fp16", "none", 1}}) {
    const std::vector<std::string> args = {"model=tiny", "seq_len=64", "batch_size=4", "threads=1", "data.prefetch=0",
                                           "data.path=synthetic", std::string("precision=") + c.precision,
                                           std::string("recompute=") + c.recompute,
                                           "grad_accum=" + std::to_string(c.accum)};
    config::TrainOptions o = config::parse_train_options(args);
    o.out_dir = make_temp_dir("mt_plan") + "/run";
    Trainer t(o);
    t.step();
    t.arena().reset_peaks();
    t.step();
    const MemStats& m = t.arena().stats();
    const plan::MemoryPlan p = plan::plan_memory(t.options(), parallel::MeshLayout{.dp = 1}, 0);
    const std::string what = std::string(c.precision) + " recompute=" + c.recompute;
    for (MemCategory k : {MemCategory::params, MemCategory::grads, MemCategory::optimizer})
      EXPECT_EQ(p.bytes[size_t(k)], m.peak[size_t(k)]) << what << ": " << mem_category_name(k);
    const double act = double(m.peak[size_t(MemCategory::activations)]);
    EXPECT_NEAR(double(p.bytes[size_t(MemCategory::activations)]), act, 0.05 * act) << what;
    std::printf("%s: activations measured %.0f, planned %llu\n", what.c_str(), act,
                (unsigned long long)p.bytes[size_t(MemCategory::activations)]);
  }
}

TEST(PlanMemory, MixtureOfExpertsModelStateIsExactAndActivationsWithinFivePercent) {
  // Every expert a unit entry of its own (model/gpt.cpp); the routing's and experts' buffers
  // (model/gpt_moe.cpp) beside the dense layers', under each recompute mode, with a shared expert and
  // with a capacity (the experts taken full: the drops make the trainer's figure the smaller).
  struct Case {
    const char* precision;
    const char* recompute;
    const char* extra;
  };
  for (const Case& c : {Case{"fp32", "none", "moe.shared=0"}, Case{"bf16", "none", "moe.shared=1"},
                        Case{"fp32", "selective", "moe.shared=1"}, Case{"bf16", "full", "moe.shared=0"},
                        Case{"fp32", "none", "moe.capacity=0.75"}, Case{"bf16", "selective", "moe.capacity=0.5"}}) {
    config::TrainOptions o = config::parse_train_options(
        {"model=tiny-moe", "seq_len=32", "batch_size=2", "threads=1", "data.prefetch=0", "data.path=synthetic",
         std::string("precision=") + c.precision, std::string("recompute=") + c.recompute, c.extra});
    o.out_dir = make_temp_dir("mt_plan") + "/run";
    Trainer t(o);
    t.step();
    t.arena().reset_peaks();
    t.step();
    const MemStats& m = t.arena().stats();
    const plan::MemoryPlan p = plan::plan_memory(t.options(), parallel::MeshLayout{.dp = 1}, 0);
    const std::string what = std::string(c.precision) + " recompute=" + c.recompute + " " + c.extra;
    for (MemCategory k : {MemCategory::params, MemCategory::grads, MemCategory::optimizer})
      EXPECT_EQ(p.bytes[size_t(k)], m.peak[size_t(k)]) << what << ": " << mem_category_name(k);
    // Dropless on one rank every buffer's size is known: the figure is exact. Under a capacity the
    // plan takes the experts full, the most they can hold.
    const size_t act = m.peak[size_t(MemCategory::activations)], planned = p.bytes[size_t(MemCategory::activations)];
    if (o.model.moe.capacity == 0) {
      EXPECT_EQ(planned, act) << what;
    } else {
      EXPECT_GE(planned, act) << what;
      EXPECT_NEAR(double(planned), double(act), 0.05 * double(act)) << what;
    }
    std::printf("%s: activations measured %zu, planned %zu\n", what.c_str(), act, planned);
  }
}

TEST(PlanHardware, BuiltInEntriesCarryTheirDatasheetFigures) {
  const plan::Hardware h100 = plan::resolve_hardware("h100"), a100 = plan::resolve_hardware("a100"), h200 = plan::resolve_hardware("h200");
  EXPECT_EQ(h100.flops_bf16, 989.5e12);
  EXPECT_EQ(h100.memory_bytes_per_s, 3.35e12);
  EXPECT_EQ(h200.memory_bytes, 141e9);
  EXPECT_EQ(h200.memory_bytes_per_s, 4.8e12);
  EXPECT_EQ(a100.flops_bf16, 312e12);
  EXPECT_EQ(a100.flops_fp32, 19.5e12);
  for (const plan::Hardware& h : {h100, a100, h200}) expect_contains(h.source, "SXM");
  EXPECT_EQ(plan::resolve_hardware("cpu").device, Device::cpu);
  // A file round-trips, and is what hw=FILE reads.
  const std::string dir = make_temp_dir("mt_hw");
  write(dir + "/h.json", h100.to_json().dump());
  const plan::Hardware back = plan::resolve_hardware(dir + "/h.json");
  EXPECT_EQ(back.to_json(), h100.to_json());
  // The datasheet entries measure no op rates: the peak and the bandwidth stand in.
  EXPECT_FALSE(h100.to_json().contains("ops"));
  EXPECT_EQ(h100.attention_flops_for(true, DType::bf16), h100.flops_bf16);
  EXPECT_EQ(h100.reduction_rate(), h100.memory_bytes_per_s);
  // A calibrated file's rates round-trip too.
  plan::Hardware cal = plan::resolve_hardware("cpu");
  cal.attention_flops_per_s = 2e10;
  cal.flash_attention_flops_per_s = 1e10;
  cal.optimizer_bytes_per_s = 6e9;
  cal.reduction_bytes_per_s = 3e9;
  write(dir + "/cal.json", cal.to_json().dump());
  const plan::Hardware cal_back = plan::resolve_hardware(dir + "/cal.json");
  EXPECT_EQ(cal_back.to_json(), cal.to_json());
  EXPECT_EQ(cal_back.attention_flops_for(false, DType::f32), 2e10);
  EXPECT_EQ(cal_back.attention_flops_for(true, DType::f32), 1e10);
  EXPECT_EQ(cal_back.optimizer_rate(), 6e9);
  EXPECT_EQ(cal_back.reduction_rate(), 3e9);
}

// The measured op rates move exactly the terms they time: attention at its own rate (the rest of the
// FLOPs at the GEMM rate), AdamW and the passes over whole gradients at theirs.
TEST(PlanTime, MeasuredOpRatesTimeTheirOwnTerms) {
  const std::string dir = make_temp_dir("mt_hw");
  plan::Hardware hw = plan::resolve_hardware("cpu");
  write(dir + "/plain.json", hw.to_json().dump());
  hw.attention_flops_per_s = hw.flops_fp32 / 4;
  hw.flash_attention_flops_per_s = hw.flops_fp32 / 8;
  hw.optimizer_bytes_per_s = hw.memory_bytes_per_s / 2;
  hw.reduction_bytes_per_s = hw.memory_bytes_per_s / 3;
  write(dir + "/slow.json", hw.to_json().dump());
  for (const char* attention : {"attention=materialized", "attention=flash"}) {
    const std::vector<std::string> args = {"model=tiny", "dp=2", "gpus=2", "zero=1", "seq_len=64", attention};
    auto with = [&](const char* file) {
      std::vector<std::string> a = args;
      a.push_back(std::string("hw=") + dir + "/" + file);
      return plan::plan_json(plan::parse_plan_request(a))["time"];
    };
    const nlohmann::json plain = with("plain.json"), slow = with("slow.json");
    const double factor = std::string(attention) == "attention=flash" ? 8 : 4;
    EXPECT_EQ(slow["gemm_s"], plain["gemm_s"]);
    EXPECT_NEAR(slow["attention_s"].get<double>(), factor * plain["attention_s"].get<double>(), 1e-15);
    EXPECT_NEAR(slow["optimizer_s"].get<double>(), 2 * plain["optimizer_s"].get<double>(), 1e-15);
    EXPECT_NEAR(slow["grad_passes_s"].get<double>(), 3 * plain["grad_passes_s"].get<double>(), 1e-15);
    // At equal rates the split is the hardware FLOPs at the GEMM rate, as before it existed.
    std::vector<std::string> plain_args = args;
    plain_args.push_back("hw=" + dir + "/plain.json");
    const plan::PlanRequest r = plan::parse_plan_request(plain_args);
    const double hw_flops =
        model::hardware_flops_per_token(r.options.model, 64, r.options.recompute, r.options.attention_kind(), Device::cpu);
    const double tokens = plan::plan_json(r)["tokens_per_step"].get<double>();
    EXPECT_NEAR((plain["gemm_s"].get<double>() + plain["attention_s"].get<double>()) * hw.flops_fp32 * 2,
                hw_flops * tokens, 1e-9 * hw_flops * tokens);
  }
}

TEST(PlanHardware, MalformedFilesFailWithOneLineNamingTheFileAndField) {
  const std::string dir = make_temp_dir("mt_hw");
  nlohmann::json good = plan::resolve_hardware("a100").to_json();
  auto without = [&](const std::string& ptr) {
    nlohmann::json j = good;
    const nlohmann::json::json_pointer p(ptr);
    j[p.parent_pointer()].erase(p.back());
    return j.dump();
  };
  nlohmann::json bad_type = good;
  bad_type["flops"]["bf16"] = "fast";
  nlohmann::json negative = good;
  negative["links"]["inter"]["bytes_per_s"] = -1;
  nlohmann::json zero_rate = good, unknown_rate = good, ops_not_object = good;
  zero_rate["ops"] = {{"attention_flops_per_s", 0}};
  unknown_rate["ops"] = {{"softmax_per_s", 1e9}};
  ops_not_object["ops"] = 3;
  const std::pair<std::string, std::string> cases[] = {
      {"{\"name\": \"x\",", "is not valid JSON"},
      {"[1, 2]", "must hold a JSON object"},
      {without("/memory/bytes_per_s"), "missing field 'memory.bytes_per_s'"},
      {without("/links/intra"), "missing field 'links.intra'"},
      {without("/name"), "missing field 'name'"},
      {bad_type.dump(), "field 'flops.bf16' must be a number (got \"fast\")"},
      {negative.dump(), "field 'links.inter.bytes_per_s' must be positive (got -1)"},
      {zero_rate.dump(), "field 'ops.attention_flops_per_s' must be positive (got 0)"},
      {unknown_rate.dump(), "unknown field 'ops.softmax_per_s'"},
      {ops_not_object.dump(), "field 'ops' must be an object of rates"},
  };
  int k = 0;
  for (const auto& [text, msg] : cases) {
    const std::string path = dir + "/bad" + std::to_string(k++) + ".json";
    write(path, text);
    const std::string e = error_of([&] { plan::resolve_hardware(path); });
    expect_contains(e, "'" + path + "'");
    expect_contains(e, msg);
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    // Through the command too: one line, not a crash.
    expect_contains(error_of([&] { plan::plan_report({"hw=" + path}); }), msg);
  }
}

TEST(PlanReport, FiguresAgreeWithEachOther) {
  const plan::PlanRequest r = plan::parse_plan_request({"model=gpt2", "hw=h100", "gpus=64", "tp=2", "pp=2", "grad_accum=8",
                                            "batch_size=8", "seq_len=1024", "precision=bf16", "zero=1",
                                            "tokens=1e10"});
  EXPECT_EQ(r.layout.dp, 16);
  EXPECT_EQ(r.options.device, Device::cuda) << "a GPU's figures are for the GPU path";
  const nlohmann::json j = plan::plan_json(r);
  const double tokens = 8.0 * 1024 * 8 * 16;
  EXPECT_EQ(j["tokens_per_step"].get<double>(), tokens);
  EXPECT_EQ(j["flops_per_token"].get<double>(), r.options.model.flops_per_token(1024));
  const double step = j["time"]["step_s"].get<double>();
  EXPECT_NEAR(j["mfu"].get<double>(), j["flops_per_token"].get<double>() * tokens / (step * 64 * 989.5e12), 1e-12);
  EXPECT_GT(j["mfu"].get<double>(), 0.0);
  EXPECT_LT(j["mfu"].get<double>(), 1.0);
  EXPECT_EQ(j["budget"]["steps"].get<double>(), std::ceil(1e10 / tokens));
  EXPECT_NEAR(j["budget"]["chip_hours"].get<double>(), j["budget"]["steps"].get<double>() * step * 64 / 3600, 1e-9);
  // A pipeline bubble from the simulator: 1f1b, p = 2, m = 8: (p-1)/m.
  EXPECT_NEAR(j["time"]["bubble_over_ideal"].get<double>(), 1.0 / 8, 1e-12);
  EXPECT_NEAR(j["pipeline"]["bubble_fraction"].get<double>(), 1.0 / 9, 1e-12);  // (p-1)/(m+p-1)
  EXPECT_EQ(j["pipeline"]["peak_micro_batches"], nlohmann::json({2.0, 1.0}));
  // The memory object uses exactly metrics.jsonl's names, and NCCL's buffers (the device's estimate).
  nlohmann::json names = memory_json(MemStats{});
  names["nccl"] = 0;
  for (auto& [k, v] : names.items()) EXPECT_TRUE(j["memory"].contains(k)) << k;
  EXPECT_EQ(j["memory"].size(), names.size());
  // Every group that communicates has bytes; ZeRO-1 all-reduces and all-gathers over dp.
  EXPECT_GT(j["comm"]["dp"]["all_reduce"]["sent_bytes"].get<double>(), 0);
  EXPECT_GT(j["comm"]["dp"]["all_gather"]["sent_bytes"].get<double>(), 0);
  EXPECT_GT(j["comm"]["tp"]["reduce_scatter"]["sent_bytes"].get<double>(), 0);
  EXPECT_GT(j["comm"]["pp"]["send"]["sent_bytes"].get<double>(), 0);
  // The text report says the same and keeps the pipeline grid.
  const std::string text = plan::plan_report({"model=gpt2", "hw=h100", "gpus=64", "tp=2", "pp=2", "grad_accum=8",
                                        "batch_size=8", "seq_len=1024", "precision=bf16", "zero=1", "tokens=1e10"});
  expect_contains(text, "TP(2)-CP(1)-PP(2)-DP(16) on 64 x h100");
  expect_contains(text, "pipeline: pp.schedule=1f1b pp=2 grad_accum=8");
  expect_contains(text, "   t r0 r1\n");
  expect_contains(text, "chip-hours on 64 chips");
}

TEST(PlanMemory, ShardingAndRecomputeShrinkWhatTheyShouldInOrder) {
  auto mem = [](std::vector<std::string> args) {
    args.insert(args.end(), {"model=gpt2", "hw=h100", "batch_size=8", "seq_len=1024", "precision=bf16"});
    const plan::PlanRequest r = plan::parse_plan_request(args);
    return plan::plan_memory_worst(r.options, r.layout);
  };
  const auto P = size_t(MemCategory::params), G = size_t(MemCategory::grads), O = size_t(MemCategory::optimizer),
             A = size_t(MemCategory::activations);
  const plan::MemoryPlan z0 = mem({"dp=8", "zero=0"}), z1 = mem({"dp=8", "zero=1"}), z2 = mem({"dp=8", "zero=2"}),
                   z3 = mem({"dp=8", "zero=3"});
  EXPECT_NEAR(double(z1.bytes[O]), double(z0.bytes[O]) / 8, 64.0);
  // ZeRO-1 keeps the full gradient and adds the shard it reduces into; ZeRO-2 keeps the shard and the
  // unit buffers in flight; ZeRO-3 gathers the parameters a unit or two at a time.
  EXPECT_EQ(z1.bytes[G], z0.bytes[G] + z0.bytes[G] / 8);
  EXPECT_LT(z2.bytes[G], z0.bytes[G]);
  EXPECT_LT(z3.bytes[P], z2.bytes[P]);
  const plan::MemoryPlan none = mem({}), sel = mem({"recompute=selective"}), full = mem({"recompute=full"});
  EXPECT_LT(sel.bytes[A], none.bytes[A]);
  EXPECT_LT(full.bytes[A], sel.bytes[A]);
  // Tensor parallelism divides the matrices; sequence parallelism the residual stream too.
  const plan::MemoryPlan tp = mem({"tp=4"}), nosp = mem({"tp=4", "tp.sp=false"});
  EXPECT_LT(tp.bytes[A], nosp.bytes[A]);
  EXPECT_LT(tp.bytes[P], none.bytes[P] / 2);
}

TEST(PlanFit, ALayoutThatCannotFitSaysWhichCategoryAndByHowMuch) {
  // GPT-2 XL on one A100 in fp32 without sharding: 16 bytes per parameter of model state alone.
  const plan::PlanRequest r = plan::parse_plan_request({"model=gpt2-xl", "hw=a100", "batch_size=16", "seq_len=1024"});
  const plan::PlanResult p = plan::evaluate_plan(r.options, r.layout, r.hw);
  ASSERT_FALSE(p.over.empty());
  expect_contains(p.over, "over by ");
  expect_contains(p.over, "a100 has 74.51 GiB");
  expect_contains(p.over, "activations is the largest category");
  EXPECT_EQ(p.over.find('\n'), std::string::npos);
  // The excess is the total less the capacity.
  const double excess = double(p.memory.total()) - 80e9;
  expect_contains(p.over, "over by " + format_bytes(size_t(excess)));
  // plan::plan_main refuses it with status 2, as train refuses a planned peak over memory (the one line
  // goes to stderr).
  EXPECT_EQ(plan::plan_main({"model=gpt2-xl", "hw=a100", "batch_size=16", "seq_len=1024"}), kExitRefused);
  EXPECT_EQ(plan::plan_main({"model=gpt2", "hw=a100", "batch_size=4", "seq_len=1024", "precision=bf16"}), 0);
}

TEST(PlanSearch, RanksTheLayoutsThatFitAndSaysWhyEachLoserLoses) {
  const std::string s = plan::plan_search(plan::parse_plan_request(
      {"--search", "gpus=8", "model=gpt2", "hw=a100", "batch_size=8", "grad_accum=4", "seq_len=1024",
       "precision=bf16"}));
  expect_contains(s, "search: gpt2 ");
  expect_contains(s, "best 5 by predicted tokens/s:\n  1. TP(");
  expect_contains(s, ": slower: ");
  expect_contains(s, ": not a valid layout: --tp 8 does not divide the model's 12 attention heads");
  // Sorted: the first line's throughput is the largest.
  const size_t a = s.find("  1. "), b = s.find("  2. ");
  ASSERT_NE(b, std::string::npos);
  auto rate = [&](size_t at) { return std::stod(s.substr(s.find(": ", at) + 2)); };
  EXPECT_GE(rate(a), rate(b));
  // Too little memory for some layouts: they are named with the category over.
  const std::string tight = plan::plan_search(plan::parse_plan_request(
      {"--search", "gpus=4", "model=gpt2-large", "hw=a100", "batch_size=32", "grad_accum=1", "seq_len=1024"}));
  expect_contains(tight, ": does not fit: needs ");
  expect_contains(tight, "is the largest category");
}

}  // namespace
}  // namespace mt::train
