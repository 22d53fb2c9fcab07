// Mixture of experts in the trainer: its options (presets, the moe.* keys, one-line errors before
// anything is written), a tiny MoE model that learns, the routing metrics of every step, the routing
// bias and the experts kept by checkpoints (a resumed run continues bitwise), the experts exported
// under their names, and the run plan's active-parameter count.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "runtime/check.h"
#include "runtime/safetensors.h"
#include "tests/test_train_util.h"
#include "tests/test_util.h"
#include "train/run_summary.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

namespace fs = std::filesystem;

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "not one line: " << what;
  }
}

TEST(MoeOptions, PresetsAndKeysSetTheMixture) {
  const config::TrainOptions o = config::parse_train_options({"model=gpt2-moe"});
  EXPECT_EQ(o.model.moe.experts, 8);
  EXPECT_EQ(o.model.moe.top_k, 2);
  EXPECT_EQ(o.model.moe.every, 2);
  EXPECT_FALSE(o.model.is_moe_layer(0));
  EXPECT_TRUE(o.model.is_moe_layer(1));
  EXPECT_EQ(o.model.num_moe_layers(), 6);
  const config::TrainOptions t = config::parse_train_options({"moe.top_k=1", "model=tiny-moe", "moe.experts=6", "moe.every=1",
                                              "moe.capacity=1.25", "moe.balance=bias", "moe.aux_coef=0.02",
                                              "moe.z_coef=0", "moe.bias_rate=0.01", "moe.shared=1"});
  const model::MoeConfig& m = t.model.moe;
  EXPECT_EQ(m.experts, 6);
  EXPECT_EQ(m.top_k, 1);  // the preset goes first, whatever the order
  EXPECT_EQ(m.every, 1);
  EXPECT_EQ(m.capacity, 1.25);
  EXPECT_EQ(m.balance, model::MoeBalance::bias);
  EXPECT_EQ(m.aux_coef, 0.02);
  EXPECT_EQ(m.z_coef, 0.0);
  EXPECT_EQ(m.bias_rate, 0.01);
  EXPECT_EQ(m.shared, 1);
  // The defaults of the issue.
  const model::MoeConfig d;
  EXPECT_EQ(d.aux_coef, 1e-2);
  EXPECT_EQ(d.z_coef, 1e-3);
  EXPECT_EQ(d.bias_rate, 1e-3);
  // The written config reloads to the same options, and the model's JSON (checkpoints) round-trips.
  const std::string dir = testing::make_temp_dir("mt_moe_cfg");
  std::ofstream(dir + "/config.json") << t.to_json().dump(2);
  EXPECT_EQ(config::parse_train_options({"--config", dir + "/config.json"}).to_json(), t.to_json());
  EXPECT_EQ(model::GPTConfig::from_json(t.model.to_json()).moe, t.model.moe);
  EXPECT_FALSE(model::GPTConfig::preset("tiny").to_json().contains("moe"));  // dense JSON unchanged
  fs::remove_all(dir);
}

TEST(MoeOptions, BadInputFailsWithOneLineBeforeAnythingIsWritten) {
  expect_error([] { config::parse_train_options({"moe.experts=2", "moe.top_k=3"}); }, "moe.top_k 3 is larger than moe.experts 2");
  expect_error([] { config::parse_train_options({"model=tiny-moe", "moe.capacity=-1"}); }, "moe.capacity must not be negative");
  expect_error([] { config::parse_train_options({"moe.experts=-4"}); }, "moe.experts must not be negative");
  expect_error([] { config::parse_train_options({"model=tiny-moe", "moe.top_k=0"}); }, "moe.top_k must be positive");
  expect_error([] { config::parse_train_options({"model=tiny-moe", "moe.every=5"}); }, "moe.every 5 is larger than model.n_layer 4");
  expect_error([] { config::parse_train_options({"model=tiny-moe", "moe.balance=loss"}); }, "moe.balance must be aux, bias or none");
  expect_error([] { config::parse_train_options({"moe.shared=1"}); }, "moe.shared=1 needs a mixture of experts");
  expect_error([] { config::parse_train_options({"model=tiny-moe", "moe.aux_coef=-0.1"}); }, "moe.aux_coef must not be negative");
  expect_error([] { config::parse_train_options({"model=tiny-moe", "moe.z_coef=nan"}); }, "moe.z_coef");
  EXPECT_NO_THROW(config::parse_train_options({"model=tiny-moe", "device=cuda"}));  // the mixture's CUDA kernels
  EXPECT_NO_THROW(config::parse_train_options({"model=tiny-moe", "device=cuda", "--dp", "2", "--ep", "2"}));  // rows over NCCL
  EXPECT_NO_THROW(config::parse_train_options({"model=tiny-moe", "--tp", "2"}));  // a mixture runs whole on each tp rank
  // zb1's split backward of mixture layers, with expert parallelism too (tests/mpi/mpi_ep_test.cpp).
  EXPECT_NO_THROW(config::parse_train_options({"model=tiny-moe", "--pp", "2", "pp.schedule=zb1"}));
  EXPECT_NO_THROW(config::parse_train_options({"model=tiny-moe", "--pp", "2", "--dp", "2", "--ep", "2", "pp.schedule=zb1"}));
  // Context parallelism: each cp rank routes its chunks' tokens, the balance term and the drops decided
  // over the whole micro-batch (moe/token_group.h; tests/mpi/mpi_moe_cp_test.cpp); ep carved from dp x cp.
  EXPECT_NO_THROW(config::parse_train_options({"model=tiny-moe", "--cp", "2", "attention=flash"}));
  EXPECT_NO_THROW(config::parse_train_options({"model=tiny-moe", "--cp", "2", "--dp", "1", "--ep", "2", "attention=flash"}));
  expect_error([] { config::parse_train_options({"model=tiny-moe", "--cp", "2", "--dp", "1", "--ep", "4", "attention=flash"}); },
               "--ep 4 does not divide --dp 1 x --cp 2 = 2: expert parallelism is carved from the data-parallel ranks");
  // Options assembled in code go through the same checks when the trainer is built, before any file.
  const std::string dir = testing::make_temp_dir("mt_moe_bad");
  config::TrainOptions o = config::parse_train_options({"model=tiny-moe", "data.path=synthetic", "out_dir=" + dir + "/run"});
  o.model.moe.top_k = 5;
  expect_error([&] { Trainer t(o); t.run(); }, "moe.top_k 5 is larger than moe.experts 4");
  EXPECT_FALSE(fs::exists(dir + "/run"));
  fs::remove_all(dir);
}

TEST(MoeOptions, RunPlanPrintsTotalAndActiveParameters) {
  RunPlan p;
  p.model = "tiny-moe";
  p.params = 4'000'000;
  p.active_params = 2'500'000;
  EXPECT_NE(format_run_plan(p).find("4.00M parameters (2.50M active per token)"), std::string::npos)
      << format_run_plan(p);
  p.active_params = p.params;
  EXPECT_EQ(format_run_plan(p).find("active"), std::string::npos);
}

class MoeTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::make_temp_dir("mt_moe_train");
    data_ = testing::write_counting_shard(dir_, 64, 400, 7);
  }
  void TearDown() override { fs::remove_all(dir_); }
  config::TrainOptions options(std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {"model=tiny-moe", "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32",
                                  "model.n_head=4", "model.block_size=32", "moe.every=1", "batch_size=4",
                                  "seq_len=32", "steps=60", "optim.lr=1e-2", "optim.warmup_steps=5",
                                  "data.path=" + data_, "out_dir=" + dir_ + "/run", "threads=2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return config::parse_train_options(a);
  }
  std::string dir_, data_;
};

TEST_F(MoeTraining, TinyMixtureLearnsAndReportsItsRouting) {
  const config::TrainOptions o = options({"moe.capacity=1.0"});
  Trainer t(o);
  double first = 0, last = 0;
  for (int i = 0; i < o.steps; i++) {
    const StepResult r = t.step();
    if (i == 0) first = r.loss;
    last = r.loss;
    ASSERT_FALSE(r.moe.is_null());
    const nlohmann::json& m = r.moe;
    ASSERT_EQ(m["tokens_per_expert"].size(), 2u);  // both layers are mixtures
    for (const auto& layer : m["tokens_per_expert"]) {
      int64_t sum = 0;
      for (const auto& n : layer) sum += n.get<int64_t>();
      EXPECT_EQ(sum, int64_t(o.batch_size) * o.seq_len * o.model.moe.top_k);
    }
    EXPECT_GE(m["drop_fraction"].get<double>(), 0.0);
    EXPECT_LT(m["drop_fraction"].get<double>(), 0.5);
    EXPECT_GE(m["imbalance"].get<double>(), 0.0);
    EXPECT_GT(m["aux_loss"].get<double>(), 0.0);
    EXPECT_GT(m["z_loss"].get<double>(), 0.0);
    EXPECT_GT(m["balance"].get<double>(), 0.5);  // E sum f P: 1 when balanced, E when collapsed
    EXPECT_LE(m["balance"].get<double>(), double(o.model.moe.experts));
  }
  std::printf("loss %.3f -> %.3f after %d steps\n", first, last, o.steps);
  EXPECT_GT(first, 3.5);  // ~ln(64) = 4.16 at initialisation
  EXPECT_LT(last, 1.5);
}

TEST_F(MoeTraining, SaveLoadContinuesBitwiseWithTheRoutingBias) {
  config::TrainOptions o = options({"moe.balance=bias", "moe.bias_rate=0.01", "moe.capacity=1.0"});
  o.steps = 8;
  Trainer full(o);
  std::vector<double> want;
  for (int i = 0; i < o.steps; i++) want.push_back(full.step().loss);
  const std::vector<float> bias_full = full.model().moe_bias(1);
  const std::string state = dir_ + "/ckpt";
  {
    Trainer first(o);
    for (int i = 0; i < 3; i++) EXPECT_EQ(first.step().loss, want[size_t(i)]);
    // Three sign steps of +-rate cannot cancel: the bias the checkpoint must carry is not zero.
    EXPECT_NE(first.model().moe_bias(1), std::vector<float>(4, 0.f));
    first.save_state(state);
  }
  config::TrainOptions o2 = o;
  o2.resume = state;
  Trainer resumed(o2);
  EXPECT_EQ(resumed.step_count(), 3);
  for (int i = 3; i < o.steps; i++) EXPECT_EQ(resumed.step().loss, want[size_t(i)]) << "step " << i;
  EXPECT_EQ(resumed.model().moe_bias(1), bias_full);
  const int64_t n = full.params().total_numel();
  EXPECT_EQ(0, std::memcmp(full.params().master(), resumed.params().master(), size_t(n) * 4));
}

TEST_F(MoeTraining, RunWritesRoutingMetricsAndExportsTheExperts) {
  config::TrainOptions o = options({"moe.capacity=0.5"});
  o.steps = 3;
  Trainer(o).run();
  std::ifstream f(dir_ + "/run/metrics.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("event") && j["event"] == "start") {
      EXPECT_LT(j["active_params"], j["params"]);
    }
    if (!j.contains("loss")) continue;
    steps++;
    ASSERT_TRUE(j.contains("moe")) << line;
    for (const char* k : {"aux_loss", "z_loss", "drop_fraction", "imbalance", "tokens_per_expert", "balance"})
      EXPECT_TRUE(j["moe"].contains(k)) << k;
    EXPECT_GT(j["moe"]["drop_fraction"].get<double>(), 0.0);  // capacity 0.5 must drop
  }
  EXPECT_EQ(steps, 3);
  const SafetensorsFile w = SafetensorsFile::read(dir_ + "/run/model.safetensors");
  ASSERT_NE(w.find("transformer.h.1.mlp.experts.3.c_fc.weight"), nullptr);
  EXPECT_NE(w.find("transformer.h.0.mlp.router.weight"), nullptr);
}

}  // namespace
}  // namespace mt::train
