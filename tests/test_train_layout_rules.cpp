// The layout rules: a tensor-parallel layout the model cannot be split for, a world that is not the
// product of the flags, sequence parallelism without tensor parallelism, rows that do not split over
// the sequence-parallel ranks, a sequence that does not cut into 2 cp chunks, cp with materialized
// attention: each fails with one line naming the flag and the numbers, before anything is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "config/layout_rules.h"
#include "config/options.h"
#include "runtime/check.h"
#include "tests/test_util.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

void expect_error(const std::function<void()>& f, const std::string& needle, const std::string& needle2 = "") {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    if (!needle2.empty()) {
      EXPECT_NE(what.find(needle2), std::string::npos) << what;
    }
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
  }
}

std::vector<std::string> tiny(std::vector<std::string> extra) {
  std::vector<std::string> a = {"model=tiny",         "model.vocab_size=64", "model.n_layer=2", "model.n_embd=32",
                                "model.n_head=4",     "model.block_size=16", "seq_len=16",      "batch_size=2",
                                "data.prefetch=0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(LayoutRules, EachBadLayoutNamesItsFlagAndNumbers) {
  expect_error([] { config::parse_train_options(tiny({"--tp", "3"})); }, "--tp 3", "4 attention heads");
  // Heads divide, the padded vocabulary (128) does not.
  expect_error([] { config::parse_train_options(tiny({"--tp", "3", "model.n_head=3", "model.n_embd=24"})); }, "--tp 3",
               "padded vocabulary (128");
  expect_error([] { config::parse_train_options(tiny({"tp.sp=true"})); }, "tp.sp=true", "--tp 1");
  expect_error([] { config::parse_train_options(tiny({"--tp", "2", "batch_size=1", "seq_len=15"})); }, "tp.sp",
               "divisible by --tp 2");
  expect_error([] { config::parse_train_options(tiny({"--tp", "0"})); }, "parallel.tp");
  expect_error([] { config::parse_train_options(tiny({"--pp", "3"})); }, "--pp 3", "2 layers");
  expect_error([] { config::parse_train_options(tiny({"tp.sp=maybe"})); }, "tp.sp");
  // Context parallelism: 2 cp chunks per sequence, ring attention (flash) on the CPU.
  expect_error([] { config::parse_train_options(tiny({"--cp", "2", "seq_len=14", "model.block_size=16"})); },
               "--cp 2: seq_len 14 must be divisible by 2 x cp = 4");
  expect_error([] { config::parse_train_options(tiny({"--cp", "4", "seq_len=12"})); }, "--cp 4", "2 x cp = 8");
  expect_error([] { config::parse_train_options(tiny({"--cp", "2", "attention=materialized"})); },
               "--cp 2 needs attention=flash");
  EXPECT_NO_THROW(config::parse_train_options(tiny({"--cp", "4"})));  // 16 = 2 x 4 x 2; attention auto -> flash
  EXPECT_EQ(config::parse_train_options(tiny({"--cp", "2"})).attention_kind(), model::Attention::flash);
  // Rows that do not split are fine without sequence parallelism.
  EXPECT_NO_THROW(config::parse_train_options(tiny({"--tp", "2", "batch_size=1", "seq_len=15", "tp.sp=false"})));
  EXPECT_NO_THROW(config::parse_train_options(tiny({"--tp", "4"})));
}

// Pipeline options: each bad one fails with one line naming it, before a trainer exists.
TEST(LayoutRules, EachBadPipelineOptionNamesItself) {
  auto four = [](std::vector<std::string> extra) {
    extra.push_back("model.n_layer=4");
    return tiny(extra);
  };
  expect_error([&] { config::parse_train_options(four({"--pp", "5"})); }, "--pp 5 is larger than the model's 4 layers");
  expect_error([&] { config::parse_train_options(four({"--pp", "2", "pp.schedule=interleaved", "pp.virtual=3",
                                               "grad_accum=2"})); },
               "6 stages", "4 layers");
  expect_error([&] { config::parse_train_options(four({"--pp", "2", "pp.layers=1,2"})); }, "pp.layers=1,2",
               "sums to 3 layers but the model has 4");
  expect_error([&] { config::parse_train_options(four({"--pp", "2", "pp.layers=1,1,2"})); }, "pp.layers=1,1,2",
               "lists 3 stages");
  expect_error([&] { config::parse_train_options(four({"--pp", "2", "pp.layers=2,x"})); }, "pp.layers=2,x", "'x'");
  expect_error([&] { config::parse_train_options(four({"--pp", "2", "pp.layers=0,4"})); }, "pp.layers=0,4");
  // Interleaved: 4 layers over 2 x 3 stages is caught above; 6 layers over 2 x 4 = 8 stages too; 6
  // over 2 x 2 does not divide.
  expect_error([&] { config::parse_train_options(tiny({"model.n_layer=6", "--pp", "2", "pp.schedule=interleaved",
                                               "pp.virtual=2", "grad_accum=2"})); },
               "pp.schedule=interleaved", "not divisible by --pp 2 x pp.virtual 2");
  // Fewer micro-batches than interleaving needs (a multiple of pp), and interleaving without chunks.
  expect_error([&] { config::parse_train_options(four({"--pp", "2", "pp.schedule=interleaved", "pp.virtual=2",
                                               "grad_accum=3"})); },
               "grad_accum");
  expect_error([&] { config::parse_train_options(four({"--pp", "2", "pp.schedule=interleaved", "grad_accum=2"})); },
               "pp.virtual");
  expect_error([&] { config::parse_train_options(four({"--pp", "2", "pp.schedule=bogus"})); }, "pp.schedule");
  expect_error([&] { config::parse_train_options(four({"pp.virtual=2"})); }, "pp.virtual=2", "--pp 2");
  expect_error([&] { config::parse_train_options(four({"pp.layers=4"})); }, "pp.layers=4", "--pp 2");
  expect_error([&] { config::parse_train_options(four({"--pp", "2", "pp.virtual=0"})); }, "pp.virtual");
  // What fits: uneven stages, interleaving with whole rounds, m < p for 1f1b.
  EXPECT_NO_THROW(config::parse_train_options(four({"--pp", "2", "pp.layers=1,3"})));
  EXPECT_NO_THROW(config::parse_train_options(four({"--pp", "2", "pp.schedule=interleaved", "pp.virtual=2", "grad_accum=4"})));
  // pp.exchange: paired on the CPU runs every schedule; ahead on cuda is refused; a bad value names itself.
  EXPECT_NO_THROW(config::parse_train_options(four({"--pp", "2", "pp.schedule=interleaved", "pp.virtual=2",
                                                    "grad_accum=4", "pp.exchange=paired"})));
  EXPECT_NO_THROW(config::parse_train_options(four({"--pp", "2", "pp.schedule=zb1", "pp.exchange=paired"})));
  expect_error([&] { config::parse_train_options(four({"--pp", "2", "device=cuda", "pp.exchange=ahead"})); },
               "pp.exchange=ahead with --device cuda");
  expect_error([&] { config::parse_train_options(four({"--pp", "2", "pp.exchange=eager"})); }, "pp.exchange=eager");
  EXPECT_EQ(config::parse_train_options(four({"--pp", "2"})).to_json()["pp"]["exchange"], "auto");
  EXPECT_NO_THROW(config::parse_train_options(four({"--pp", "4", "pp.schedule=gpipe", "grad_accum=1"})));
  // GPUs: the messages travel over NCCL (whether this build and machine have a GPU is the trainer's
  // check, not the options').
  EXPECT_NO_THROW(config::parse_train_options(four({"--pp", "2", "device=cuda"})));
  EXPECT_NO_THROW(config::parse_train_options(four({"--pp", "2", "pp.schedule=zb1", "device=cuda", "precision=bf16"})));
  EXPECT_NO_THROW(config::parse_train_options(four({"--pp", "4", "pp.schedule=gpipe", "grad_accum=3", "device=cuda"})));
  // Interleaved on GPUs too, including the rounds that deadlocked when each compute action's messages
  // were paired on their own (p 2, m 4, v 2; parallel/pipeline_exchange.h).
  EXPECT_NO_THROW(config::parse_train_options(four({"--pp", "2", "pp.schedule=interleaved", "pp.virtual=2",
                                                    "grad_accum=4", "device=cuda"})));
  EXPECT_NO_THROW(config::parse_train_options(tiny({"model.n_layer=8", "--pp", "4", "pp.schedule=interleaved",
                                                    "pp.virtual=2", "grad_accum=8", "device=cuda"})));
  const config::TrainOptions o = config::parse_train_options(four({"--pp", "4", "pp.schedule=gpipe"}));
  EXPECT_EQ(o.to_json()["pp"]["schedule"], "gpipe");
}

// Balanced by cost: the largest stage as small as possible, then the squares; ties to later stages.
TEST(LayoutRules, BalancedStagesCountTheClassifier) {
  // Equal layers, nothing extra: the even split with the remainder on the later stages.
  EXPECT_EQ(config::balanced_layers(7, 3, 10, 0, 0), (std::vector<int>{2, 2, 3}));
  EXPECT_EQ(config::balanced_layers(8, 4, 10, 0, 0), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(config::balanced_layers(3, 3, 10, 0, 0), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(config::balanced_layers(5, 1, 10, 4, 4), (std::vector<int>{5}));
  // A classifier worth 4.47 layers (gpt2 at T = 1024) leaves the last stage one layer; the other 11
  // go 3, 4, 4 (the largest stage is the last one, 5.47 layers, however they go).
  EXPECT_EQ(config::balanced_layers(12, 4, 100, 0, 447), (std::vector<int>{3, 4, 4, 1}));
  // A classifier worth 1.5 layers: 8 layers over 2 stages go 5 + (3 + 1.5).
  EXPECT_EQ(config::balanced_layers(8, 2, 10, 0, 15), (std::vector<int>{5, 3}));
  // The embedding's cost moves a layer off stage 0 when it tips the balance.
  EXPECT_EQ(config::balanced_layers(4, 2, 10, 11, 0), (std::vector<int>{1, 3}));
  // Through the options: gpt2 on 4 stages, and an interleaved model stays even.
  const config::TrainOptions g = config::parse_train_options({"model=gpt2", "seq_len=1024", "--pp", "4", "--dp", "1", "grad_accum=4"});
  EXPECT_EQ(config::stage_layers(g), (std::vector<int>{3, 4, 4, 1}));
  const config::TrainOptions i = config::parse_train_options(
      {"model=gpt2", "--pp", "2", "--dp", "1", "pp.schedule=interleaved", "pp.virtual=2", "grad_accum=4"});
  EXPECT_EQ(config::stage_layers(i), (std::vector<int>{3, 3, 3, 3}));
}

// Layers per stage: balanced (a small classifier: the remainder to stages 1, 2, ...); given;
// interleaved chunks on a rank.
TEST(LayoutRules, StagesSplitTheLayers) {
  const config::TrainOptions a = config::parse_train_options(tiny({"model.n_layer=7", "--pp", "3"}));
  EXPECT_EQ(config::stage_layers(a), (std::vector<int>{2, 3, 2}));
  const config::TrainOptions b = config::parse_train_options(tiny({"model.n_layer=7", "--pp", "2", "pp.layers=5,2"}));
  EXPECT_EQ(config::stage_layers(b), (std::vector<int>{5, 2}));
  const model::StagePlan last = config::stage_plan(b, 1);
  ASSERT_EQ(last.chunks.size(), 1u);
  EXPECT_EQ(last.chunks[0].begin, 5);
  EXPECT_EQ(last.chunks[0].end, 7);
  EXPECT_FALSE(last.first);
  EXPECT_TRUE(last.last);
  const config::TrainOptions c = config::parse_train_options(
      tiny({"model.n_layer=8", "--pp", "2", "pp.schedule=interleaved", "pp.virtual=2", "grad_accum=2"}));
  const model::StagePlan r0 = config::stage_plan(c, 0);  // stages 0 and 2
  ASSERT_EQ(r0.chunks.size(), 2u);
  EXPECT_EQ(r0.chunks[0].begin, 0);
  EXPECT_EQ(r0.chunks[1].begin, 4);
  EXPECT_EQ(r0.chunks[1].end, 6);
  EXPECT_TRUE(r0.first);
  EXPECT_FALSE(r0.last);
}

TEST(LayoutRules, AWorldThatIsNotTheProductFailsBeforeWriting) {
  const std::string dir = testing::make_temp_dir("mt_layout");
  config::TrainOptions o = config::parse_train_options(tiny({"--tp", "2", "out_dir=" + dir + "/run", "data.path=" + dir + "/x.bin"}));
  expect_error([&] { Trainer t(o); }, "--tp 2", "world size 1");
  EXPECT_FALSE(std::filesystem::exists(dir + "/run"));
}

// Expert parallelism: experts that do not split over --ep, an --ep that does not divide dp x cp (given
// or inferred from the world), --ep without a mixture of experts; one line each, nothing written.
TEST(LayoutRules, EachBadExpertLayoutNamesItsFlagAndNumbers) {
  auto moe = [](std::vector<std::string> extra) {
    extra.push_back("model=tiny-moe");
    return tiny(extra);
  };
  expect_error([&] { config::parse_train_options(moe({"--ep", "3", "--dp", "3"})); }, "moe.experts=4",
               "not divisible by --ep 3");
  expect_error([&] { config::parse_train_options(moe({"--ep", "4", "--dp", "2"})); }, "--ep 4 does not divide --dp 2 x --cp 1");
  expect_error([&] { config::parse_train_options(tiny({"--ep", "2", "--dp", "2"})); }, "--ep 2 needs a mixture of experts");
  expect_error([&] { config::parse_train_options(moe({"--ep", "0"})); }, "parallel.ep");
  EXPECT_NO_THROW(config::parse_train_options(moe({"--ep", "2", "--dp", "4"})));
  EXPECT_NO_THROW(config::parse_train_options(moe({"ep=4", "--dp", "4"})));
  EXPECT_EQ(config::parse_train_options(moe({"ep=2", "--dp", "2"})).to_json()["parallel"]["ep"], 2);
  // dp inferred from the world: one rank cannot hold two expert-parallel ranks.
  const std::string dir = testing::make_temp_dir("mt_layout_ep");
  config::TrainOptions o = config::parse_train_options(moe({"--ep", "2", "out_dir=" + dir + "/run", "data.path=" + dir + "/x.bin"}));
  expect_error([&] { Trainer t(o); }, "--ep 2 does not divide --dp 1 x --cp 1 = 1");
  EXPECT_FALSE(std::filesystem::exists(dir + "/run"));
  // The mesh arithmetic alone: ep carved from dp x cp.
  EXPECT_THROW(parallel::resolve_layout(parallel::MeshLayout{.dp = 3, .ep = 2}, 3), parallel::CollectiveError);
  EXPECT_NO_THROW(parallel::resolve_layout(parallel::MeshLayout{.dp = 2, .cp = 2, .ep = 4}, 4));
}

TEST(LayoutRules, TheResolvedConfigRecordsSequenceParallelism) {
  const config::TrainOptions a = config::parse_train_options(tiny({"--tp", "2"}));
  EXPECT_TRUE(a.sequence_parallel());
  const config::TrainOptions b = config::parse_train_options(tiny({"--tp", "2", "tp.sp=false"}));
  EXPECT_FALSE(b.sequence_parallel());
  EXPECT_EQ(b.to_json()["parallel"]["sp"], false);
  EXPECT_EQ(a.to_json()["parallel"]["sp"], "auto");
}

// Context parallelism on the device: ring attention's blocks over the cp group's NCCL communicator
// (parallel/ring_attention.h; tests/mpi/mpi_sim_cp_test.cpp), so --cp with --device cuda parses; its
// other rules stay (attention=flash, seq_len divisible by 2 cp), on either device.
TEST(LayoutRules, ContextParallelismRunsOnTheDeviceWithItsRules) {
  EXPECT_NO_THROW(config::parse_train_options(tiny({"--cp", "2", "device=cuda"})));
  EXPECT_NO_THROW(config::parse_train_options(tiny({"--cp", "2"})));
  for (const char* device : {"device=cpu", "device=cuda"}) {
    expect_error([&] { config::parse_train_options(tiny({"--cp", "2", device, "attention=materialized"})); },
                 "--cp 2 needs attention=flash");
  }
}

}  // namespace
}  // namespace mt::train
