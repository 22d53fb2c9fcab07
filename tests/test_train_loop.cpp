// The training loop as a user relies on it: loss falls, runs are reproducible, a saved state resumes
// bitwise, fp16 loss scaling skips overflowing steps, and bad inputs fail before anything is written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "data/loader.h"
#include "data/shard.h"
#include "runtime/check.h"
#include "tests/test_train_util.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

using testing::write_counting_shard;

config::TrainOptions tiny_options(const std::string& data, const std::string& out) {
  return config::parse_train_options({"model=tiny", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32",
                              "model.n_head=4", "model.block_size=32", "batch_size=4", "seq_len=32",
                              "steps=60", "optim.lr=1e-2", "optim.warmup_steps=5", "data.path=" + data,
                              "data.mode=shuffled", "out_dir=" + out, "threads=2"});
}

class TrainLoop : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("mt_train");
    data_ = write_counting_shard(dir_, 64, 400, 7);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_, data_;
};

TEST_F(TrainLoop, TinyModelLossFallsBelowBound) {
  config::TrainOptions o = tiny_options(data_, dir_ + "/run");
  Trainer t(o);
  double first = 0, last = 0;
  for (int i = 0; i < o.steps; i++) {
    StepResult r = t.step();
    if (i == 0) first = r.loss;
    last = r.loss;
  }
  std::printf("loss %.3f -> %.3f after %d steps\n", first, last, o.steps);
  EXPECT_GT(first, 3.5);  // ~ln(64) = 4.16 at initialisation
  EXPECT_LT(last, 1.5);   // counting is learnable: a falling loss proves learning, not noise
}

TEST_F(TrainLoop, IdenticalRunsGiveIdenticalLosses) {
  for (const char* prec : {"fp32", "bf16"}) {
    config::TrainOptions o = tiny_options(data_, dir_ + "/run");
    config::apply_option(o, "precision", prec);
    Trainer a(o), b(o);
    for (int i = 0; i < 6; i++) EXPECT_EQ(a.step().loss, b.step().loss) << prec << " step " << i;
  }
}

void expect_same_state(Trainer& a, Trainer& b) {
  const int64_t n = a.params().total_numel();
  EXPECT_EQ(0, std::memcmp(a.params().master(), b.params().master(), size_t(n) * 4)) << "master weights differ";
  EXPECT_EQ(0, std::memcmp(a.params().compute(), b.params().compute(), a.params().compute_bytes(n)))
      << "compute weights differ";
}

// Without mem.poison a reused activation block keeps its last owner's bytes; with it every reused
// block is NaN until written, as a new one is. The same bits either way prove that no op of these
// configurations reads a reused buffer before writing it (one that did would read NaN poisoned, the
// last step's values not: the losses or the weights would differ).
TEST_F(TrainLoop, PoisoningReusedBlocksChangesNoBit) {
  const std::vector<std::vector<std::string>> configs = {
      {},
      {"precision=bf16", "attention=flash"},
      {"recompute=selective", "grad_accum=2"},
      {"recompute=full", "precision=bf16"},
      {"moe.experts=4", "moe.top_k=2", "moe.every=1", "moe.capacity=1.0", "moe.shared=1"}};
  for (const std::vector<std::string>& extra : configs) {
    std::string what;
    config::TrainOptions o = tiny_options(data_, dir_ + "/run");
    for (const std::string& kv : extra) {
      const size_t eq = kv.find('=');
      config::apply_option(o, kv.substr(0, eq), kv.substr(eq + 1));
      what += kv + " ";
    }
    config::TrainOptions poisoned = o;
    config::apply_option(poisoned, "mem.poison", "1");
    Trainer a(o), b(poisoned);
    ASSERT_FALSE(a.arena().poison_reused()) << "reused blocks are poisoned by default";
    ASSERT_TRUE(b.arena().poison_reused()) << "mem.poison=1 did not reach the arena";
    for (int i = 0; i < 4; i++) {
      const double la = a.step().loss, lb = b.step().loss;
      ASSERT_TRUE(std::isfinite(lb)) << what << "step " << i << ": a read before a write met the poison";
      EXPECT_EQ(la, lb) << what << "step " << i;
    }
    expect_same_state(a, b);
  }
}

TEST_F(TrainLoop, SaveLoadContinueEqualsUninterruptedBitwise) {
  for (const char* prec : {"fp32", "fp16"}) {
    config::TrainOptions o = tiny_options(data_, dir_ + "/run");
    config::apply_option(o, "precision", prec);
    config::apply_option(o, "optim.grad_clip", "0.5");
    o.steps = 12;
    Trainer full(o);
    std::vector<double> want;
    for (int i = 0; i < o.steps; i++) want.push_back(full.step().loss);

    const std::string state = dir_ + "/ckpt";
    {
      Trainer first(o);
      for (int i = 0; i < 5; i++) EXPECT_EQ(first.step().loss, want[size_t(i)]);
      first.save_state(state);
    }
    config::TrainOptions o2 = o;
    o2.resume = state;
    Trainer resumed(o2);
    EXPECT_EQ(resumed.step_count(), 5);
    for (int i = 5; i < o.steps; i++) EXPECT_EQ(resumed.step().loss, want[size_t(i)]) << prec << " step " << i;
    expect_same_state(full, resumed);
  }
}

// A load must restore everything: a trainer whose weights, AdamW moments, step count and data
// position were all moved away (by training on) first, then loaded, continues exactly like the run
// that wrote the checkpoint. A load that skipped any part would not.
TEST_F(TrainLoop, LoadOverwritesScrambledStateCompletely) {
  config::TrainOptions o = tiny_options(data_, dir_ + "/run");
  o.steps = 10;
  Trainer full(o);
  std::vector<double> want;
  for (int i = 0; i < o.steps; i++) want.push_back(full.step().loss);
  {
    Trainer first(o);
    for (int i = 0; i < 4; i++) first.step();
    first.save_state(dir_ + "/ckpt");
  }
  Trainer resumed(o);
  for (int i = 0; i < 7; i++) resumed.step();  // same optimizer settings, but moved on to step 7
  resumed.load_state(dir_ + "/ckpt");
  EXPECT_EQ(resumed.step_count(), 4);
  for (int i = 4; i < o.steps; i++) EXPECT_EQ(resumed.step().loss, want[size_t(i)]) << "step " << i;
  expect_same_state(full, resumed);
}

TEST_F(TrainLoop, Fp16OverflowSkipsTheStepAndHalvesTheScale) {
  config::TrainOptions o = tiny_options(data_, dir_ + "/run");
  config::apply_option(o, "precision", "fp16");
  config::apply_option(o, "loss_scale.init", "1e30");  // guaranteed to overflow fp16 gradients
  Trainer t(o);
  std::vector<float> before(t.params().master(), t.params().master() + t.params().total_numel());
  StepResult r = t.step();
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(0, std::memcmp(before.data(), t.params().master(), before.size() * 4)) << "a skipped step changed weights";
  int skipped = 1;
  while (t.step().skipped) skipped++;
  std::printf("fp16: %d steps skipped before the scale fit\n", skipped);
  EXPECT_GT(skipped, 1);
  EXPECT_LT(skipped, 100);
}

TEST(LossScaler, HalvesOnOverflowAndGrowsAfterCleanSteps) {
  config::LossScaleOptions lo;
  lo.init_scale = 1024;
  lo.growth_interval = 3;
  LossScaler s(lo, true);
  s.update(true);
  EXPECT_EQ(s.scale(), 512);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 512);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024);
  LossScaler off(lo, false);
  off.update(true);
  EXPECT_EQ(off.scale(), 1);
}

TEST(LrSchedule, WarmupThenCosineToMinimum) {
  config::OptimOptions o;
  o.lr = 1.0f;
  o.warmup_steps = 4;
  o.min_lr_ratio = 0.1f;
  EXPECT_FLOAT_EQ(lr_at(o, 0, 20), 0.25f);
  EXPECT_FLOAT_EQ(lr_at(o, 3, 20), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(o, 4, 20), 1.0f);
  EXPECT_NEAR(lr_at(o, 19, 20), 0.1f, 1e-6);
  o.schedule = config::LrSchedule::linear;
  EXPECT_NEAR(lr_at(o, 19, 20), 0.1f, 1e-6);
  o.schedule = config::LrSchedule::constant;
  EXPECT_FLOAT_EQ(lr_at(o, 15, 20), 1.0f);
}

TEST_F(TrainLoop, RunWritesMetricsStateAndWeights) {
  config::TrainOptions o = tiny_options(data_, dir_ + "/run");
  o.steps = 3;
  Trainer(o).run();
  std::ifstream f(dir_ + "/run/metrics.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("step") && j.contains("loss")) {
      steps++;
      for (const char* k : {"lr", "grad_norm", "tokens_per_s", "mfu", "hfu", "time", "memory"})
        EXPECT_TRUE(j.contains(k)) << "metrics line lacks " << k;
    }
  }
  EXPECT_EQ(steps, 3);
  EXPECT_TRUE(fs::exists(dir_ + "/run/checkpoints/latest"));
  EXPECT_TRUE(fs::exists(dir_ + "/run/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ + "/run/config.json"));
  // A second fresh run into the same directory refuses instead of overwriting the logs.
  EXPECT_THROW(Trainer(o).run(), Error);
}

// Each bad input fails with an mt::Error whose message names the culprit.
void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(TrainLoop, BadInputsFailWithAClearMessageAndWriteNothing) {
  const std::string out = dir_ + "/never";
  expect_error([&] { config::parse_train_options({"no_such_key=1"}); }, "no_such_key");
  expect_error([&] { config::parse_train_options({"--bogus", "1"}); }, "--bogus");
  expect_error([&] { config::parse_train_options({"batch_size=-2"}); }, "batch_size");
  expect_error([&] { config::parse_train_options({"steps=abc"}); }, "steps");
  expect_error([&] { config::parse_train_options({"model.n_embd=30", "model.n_head=4"}); }, "n_head");
  expect_error([&] { config::parse_train_options({"model.block_size=16", "seq_len=32"}); }, "block_size");
  expect_error([&] { config::parse_train_options({"precision=fp8"}); }, "precision");
  expect_error([&] { config::parse_train_options({"--attention", "fast"}); }, "--attention");
  {
    std::ofstream(dir_ + "/bad.json") << "{\"steps\": 3,,}";
    expect_error([&] { config::parse_train_options({"--config", dir_ + "/bad.json"}); }, "bad.json");
  }
  expect_error([&] { Trainer(tiny_options(dir_ + "/missing.bin", out)); }, "missing.bin");
  {  // data whose vocabulary is larger than the model's
    config::TrainOptions o = tiny_options(data_, out);
    o.model.vocab_size = 32;
    expect_error([&] { Trainer t(o); }, "vocab");
  }
  {  // a state file of another model shape
    config::TrainOptions o = tiny_options(data_, out);
    Trainer(o).save_state(dir_ + "/s");
    o.model.n_layer = 3;
    o.resume = dir_ + "/s";
    expect_error([&] { Trainer t(o); }, "another model shape");
  }
  {  // a truncated data file
    std::ofstream(dir_ + "/short.bin") << "MTOK";
    expect_error([&] { Trainer(tiny_options(dir_ + "/short.bin", out)); }, "short.bin");
  }
  {  // data.mix replaces data.path: both set would leave one silently unused
    config::TrainOptions o = tiny_options(data_, out);
    config::apply_option(o, "data.mix", data_ + ":1");
    expect_error([&] { Trainer t(o); }, "data.path=" + data_ + " and data.mix=" + data_ + ":1 are both set");
  }
  {  // validation data whose vocabulary is larger than the model's
    config::TrainOptions o = tiny_options(data_, out);
    fs::create_directory(dir_ + "/wide");
    config::apply_option(o, "data.val_path", write_counting_shard(dir_ + "/wide", 128, 50, 3));
    config::apply_option(o, "eval_every", "10");
    expect_error([&] { Trainer t(o); }, "validation data '" + dir_ + "/wide/counting.bin' uses a vocabulary of 128");
  }
  {  // validation data made with another tokenizer (same vocabulary size)
    for (const char* d : {"/a", "/b"}) {
      fs::create_directory(dir_ + d);
      fs::copy_file(data_, dir_ + d + "/counting.bin");
      std::ofstream(dir_ + d + "/meta.json") << "{\"tokenizer_fingerprint\": \"" << (d[1] == 'a' ? "0a" : "0b") << "\"}";
    }
    config::TrainOptions o = tiny_options(dir_ + "/a/counting.bin", out);
    config::apply_option(o, "data.val_path", dir_ + "/b/counting.bin");
    config::apply_option(o, "eval_every", "10");
    expect_error([&] { Trainer t(o); }, "data.val_path " + dir_ + "/b/counting.bin (tokenizer fingerprint 0b) and the "
                                        "training data " + dir_ + "/a/counting.bin (tokenizer fingerprint 0a)");
  }
  EXPECT_FALSE(fs::exists(out)) << "a failed start created the output directory";
}

}  // namespace
}  // namespace mt::train

namespace mt::train {
namespace {

// With the expected squared norms at two batch sizes, E|g_B|^2 = |G|^2 + tr(Sigma)/B, the
// estimator recovers |G|^2, tr(Sigma) and B_simple = tr(Sigma)/|G|^2 exactly (McCandlish et al. 2018).
TEST(NoiseScale, RecoversTraceAndSignalFromTwoBatchSizes) {
  const double G2 = 4, S = 100;
  NoiseScale n;
  EXPECT_FALSE(n.valid());
  for (int i = 0; i < 5; i++) n.update(G2 + S / 10, G2 + S / 40, 10, 40);
  ASSERT_TRUE(n.valid());
  EXPECT_NEAR(n.g2(), G2, 1e-9);
  EXPECT_NEAR(n.trace_sigma(), S, 1e-9);
  EXPECT_NEAR(n.b_simple(), 25, 1e-9);
}

}  // namespace
}  // namespace mt::train

namespace mt::train {
namespace {

// One default data mode, the loader's own (README: shuffled).
TEST(Options, DefaultDataModeIsTheLoadersShuffled) {
  EXPECT_EQ(config::TrainOptions{}.data.mode, "shuffled");
  EXPECT_EQ(config::parse_train_options({}).data.mode, "shuffled");
  EXPECT_EQ(data::LoaderConfig{}.mode, data::SampleMode::shuffled);
}

// The resolved config a run writes (config.json) is a valid --config that resolves to itself.
TEST(Options, WrittenConfigReloadsToTheSameOptions) {
  const std::string dir = testing::make_temp_dir("mt_cfg");
  config::TrainOptions o = config::parse_train_options({"model=gpt2", "model.n_layer=3", "precision=bf16", "recompute=selective",
                                        "optim.schedule=linear", "data.doc_mask=true", "--zero", "2",
                                        "ckpt.keep=5", "seed=18446744073709551557", "global_batch=16"});
  std::ofstream(dir + "/config.json") << o.to_json().dump(2);
  const config::TrainOptions back = config::parse_train_options({"--config", dir + "/config.json"});
  EXPECT_EQ(back.to_json(), o.to_json());
  EXPECT_EQ(back.seed, 18446744073709551557ull);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mt::train

namespace mt::train {
namespace {

// The dotted keys of every numeric option (from the resolved config, so a new option is covered).
void numeric_keys(const nlohmann::json& j, const std::string& prefix, std::vector<std::string>& out) {
  for (auto& [k, v] : j.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object()) numeric_keys(v, key, out);
    if (v.is_number()) out.push_back(key);
  }
}

// Every numeric option refuses NaN and infinity, given as key=value or in a --config file (as a
// JSON string; a number too large for a double is refused as bad JSON, naming the file), and a
// value outside its range, with one error naming the key.
TEST(Options, EveryNumericOptionRefusesNonFiniteAndOutOfRangeValues) {
  const std::string dir = testing::make_temp_dir("mt_opts");
  std::vector<std::string> keys;
  numeric_keys(config::TrainOptions().to_json(), "", keys);
  ASSERT_GT(keys.size(), 30u);
  // A config file setting the dotted `key` to the JSON text `value`: {"optim": {"lr": value}}.
  auto config = [&](const std::string& key, const std::string& value) {
    std::string text = value;
    for (size_t end = key.size(), dot; end != 0; end = dot) {
      dot = key.rfind('.', end - 1);
      dot = dot == std::string::npos ? 0 : dot;
      const size_t from = dot == 0 ? 0 : dot + 1;
      text = "{\"" + key.substr(from, end - from) + "\": " + text + "}";
    }
    std::ofstream(dir + "/c.json") << text;
    return std::vector<std::string>{"--config", dir + "/c.json"};
  };
  for (const std::string& key : keys) {
    SCOPED_TRACE(key);
    for (const char* v : {"nan", "NaN", "inf", "-inf", "infinity", "1e999"}) {
      expect_error([&] { config::parse_train_options({key + "=" + v}); }, key);
      expect_error([&] { config::parse_train_options(config(key, std::string("\"") + v + "\"")); }, key);
    }
    expect_error([&] { config::parse_train_options(config(key, "1e999")); }, "c.json");  // not even valid JSON
  }
  // Each range, just outside (the values just inside are the defaults or the next lines' controls).
  const std::vector<std::pair<std::string, std::string>> outside = {
      {"optim.lr", "-1e-9"}, {"optim.eps", "0"}, {"optim.beta1", "1"}, {"optim.beta2", "-0.1"},
      {"optim.min_lr_ratio", "1.5"}, {"optim.weight_decay", "-0.1"}, {"optim.warmup_steps", "-1"},
      {"loss_scale.init", "0"}, {"loss_scale.growth_interval", "0"}, {"loss_scale.max_skips", "0"},
      {"parallel.bucket_mb", "0"}, {"parallel.zero", "4"}, {"parallel.dp", "-1"}, {"parallel.sdc_every", "-1"},
      {"peak_flops", "-1"}, {"ckpt.keep", "-1"}, {"ckpt.fault_rank", "-2"}, {"ckpt.fault_step", "-2"},
      {"data.prefetch", "-1"}, {"threads", "-1"}, {"eval_batches", "0"}, {"log_every", "0"}, {"steps", "0"},
      {"grad_accum", "0"}, {"global_batch", "-4"}, {"save_every", "-1"}, {"model.n_layer", "0"}};
  for (const auto& [key, v] : outside) {
    SCOPED_TRACE(key + "=" + v);
    expect_error([&] { config::parse_train_options({key + "=" + v}); }, key);
    expect_error([&] { config::parse_train_options(config(key, v)); }, key);
  }
  // Set in code, past the parser: the same check.
  config::TrainOptions o;
  o.optim.grad_clip = NAN;
  expect_error([&] { o.validate(); }, "optim.grad_clip");
  EXPECT_NO_THROW(config::parse_train_options({"optim.lr=0", "optim.beta1=0", "optim.min_lr_ratio=1", "optim.grad_clip=-1"}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mt::train
