// Packing with document masking is invisible to each document: in a packed batch, every document
// wholly inside a row gets exactly the loss it gets when run alone (data issue, item 3).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "config/options.h"
#include "data/packer.h"
#include "data/shard.h"
#include "model/gpt.h"
#include "tests/test_util.h"
#include "train/batches.h"

namespace mt::train {
namespace {

TEST(Packing, EachPackedDocumentHasTheLossItHasAlone) {
  const int V = 64, EOT = 63, T = 48, B = 3;
  std::mt19937_64 rng(testing::test_seed());
  const std::string dir = testing::make_temp_dir("mt_pack");
  // Documents of 3..12 tokens, so several fit in each row.
  std::vector<std::vector<int32_t>> docs;
  data::ShardBuilder sb(V, EOT);
  for (int d = 0; d < 60; d++) {
    std::vector<int32_t> doc(size_t(3 + rng() % 10));
    for (auto& t : doc) t = int32_t(rng() % (V - 1));
    sb.add_document(doc);
    docs.push_back(doc);
  }
  sb.write(dir + "/docs.bin");

  config::TrainOptions o = config::parse_train_options({"model.vocab_size=64", "model.block_size=64", "model.n_layer=2",
                                        "model.n_embd=32", "model.n_head=4", "seq_len=48", "batch_size=3",
                                        "data.doc_mask=true", "data.prefetch=0", "data.path=" + dir + "/docs.bin"});
  auto src = open_batches(o, "train", 0, 1);
  HostBatch b;
  src->next(b);
  ASSERT_FALSE(b.doc_ids.empty());

  Arena arena;
  ParamStore store;
  model::GPT gpt(o.model, store);
  store.finalize(arena, DType::f32);
  gpt.init_weights(testing::test_seed() + 1);
  gpt.set_arena(&arena);

  // For each complete document in the packed batch (it starts with EOT at position 0 and is followed
  // by the next document's start inside the row), its loss in the batch vs alone.
  int checked = 0;
  double worst = 0;
  for (int r = 0; r < B; r++) {
    const int32_t* in = b.inputs.data() + r * T;
    const int32_t* doc = b.doc_ids.data() + r * T;
    const int32_t* pos = b.positions.data() + r * T;
    for (int s = 0; s < T; s++) {
      if (pos[s] != 0 || in[s] != EOT) continue;
      int e = s;
      while (e + 1 < T && doc[e + 1] == doc[s]) e++;
      if (e + 1 >= T) continue;  // runs to the row's end: cut by the window, not whole
      // Loss of the document's tokens within the packed batch: mask every other target.
      std::vector<int32_t> targets(b.targets.size(), -1);
      for (int t = s; t <= e; t++) targets[size_t(r * T + t)] = b.targets[size_t(r * T + t)];
      model::MicroBatch packed = view(b);
      packed.targets = targets.data();
      const double in_batch = gpt.forward_loss(packed);
      // Alone: inputs [EOT, d...], targets [d..., EOT].
      std::vector<int32_t> din(in + s + 1, in + e + 1);
      std::vector<int32_t> ai, at, ap;
      data::single_document_row(ai, at, ap, din, EOT);
      ASSERT_EQ(int(ai.size()), e - s + 1);
      model::MicroBatch alone{1, int(ai.size()), ai.data(), at.data(), nullptr, nullptr};
      const double by_itself = gpt.forward_loss(alone);
      const double rel = std::fabs(in_batch - by_itself) / std::fabs(by_itself);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 1e-5) << "row " << r << " document at " << s << ".." << e;
      checked++;
    }
  }
  std::printf("%d packed documents checked, max relative loss difference %.2e\n", checked, worst);
  EXPECT_GE(checked, 3);
}

}  // namespace
}  // namespace mt::train
